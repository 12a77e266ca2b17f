"""Optional ed25519 signatures of engine files, for users who need authenticity and not only
integrity: `graphc sign ENGINE --key KEY.pem` and `graphc run/inspect ENGINE --verify-key PUB.pem`
(or `graphc.runtime.load(path, verify_key=...)`).

What is signed is the manifest's SHA-256 (from the zip comment), prefixed with a domain tag; the
manifest holds the SHA-256 of every other member, so the signature covers the whole engine. The
signature goes into the zip comment beside the digest. Keys are PEM files, as written by
`openssl genpkey -algorithm ed25519 -out key.pem` and `openssl pkey -in key.pem -pubout -out pub.pem`,
or by `write_keypair` here. Needs the `cryptography` package (PyPI), graphc's `sign` extra.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

from graphc.runtime.container import make_comment, parse_comment
from graphc.runtime.errors import EngineError

_TAG = b"graphc-engine manifest-sha256:"


def _crypto() -> Any:
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise EngineError(
            "engine signatures need the 'cryptography' package: pip install cryptography (from PyPI)"
        ) from None
    return serialization, ed25519, InvalidSignature


def _read_key(path: str | Path, private: bool) -> Any:
    serialization, ed25519, _ = _crypto()
    p = Path(path)
    what = "private" if private else "public"
    try:
        data = p.read_bytes()
    except OSError as e:
        raise EngineError(f"{p}: cannot read the {what} key: {e.strerror or e}") from None
    try:
        if private:
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise EngineError(f"{p}: not a PEM {what} key ({first})") from None
    want = ed25519.Ed25519PrivateKey if private else ed25519.Ed25519PublicKey
    if not isinstance(key, want):
        raise EngineError(f"{p}: not an ed25519 {what} key ({type(key).__name__})")
    return key


def write_keypair(private_path: str | Path, public_path: str | Path) -> None:
    """A new ed25519 key pair as PEM files (the private one readable by its owner only)."""
    serialization, ed25519, _ = _crypto()
    key = ed25519.Ed25519PrivateKey.generate()
    priv = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(priv)
    Path(public_path).write_bytes(pub)


def sign_engine(path: str | Path, key_path: str | Path) -> str:
    """Sign a (valid) engine file in place; returns the signed manifest digest."""
    from graphc.runtime.format import read_engine

    path = Path(path)
    key = _read_key(key_path, private=True)
    ef = read_engine(path)  # only a valid engine is worth a signature
    signature = key.sign(_TAG + ef.manifest_digest.encode())
    tmp = path.with_name(path.name + ".signing")
    shutil.copyfile(path, tmp)
    try:
        with zipfile.ZipFile(tmp, "a") as z:
            z.comment = make_comment(ef.manifest_digest, signature)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return ef.manifest_digest


def verify_digest(digest: str, signature: bytes | None, public_key: str | Path, path: Path) -> None:
    """Refuse unless `signature` is the key's signature of this manifest digest."""
    key = _read_key(public_key, private=False)
    if signature is None:
        raise EngineError(f"{path}: the engine is not signed (sign it with `graphc sign {path} --key KEY.pem`)")
    _, _, invalid = _crypto()
    try:
        key.verify(signature, _TAG + digest.encode())
    except invalid:
        raise EngineError(f"{path}: the engine's signature does not verify with {public_key}") from None


def signature_of(path: str | Path) -> bytes | None:
    """The signature recorded in an engine file, if any (no validation)."""
    p = Path(path)
    try:
        with zipfile.ZipFile(p) as z:
            comment = z.comment
    except (zipfile.BadZipFile, OSError) as e:
        raise EngineError(f"{p}: not a graphc engine ({e})") from None
    return parse_comment(comment, p)[1]


__all__ = ["sign_engine", "signature_of", "verify_digest", "write_keypair"]
