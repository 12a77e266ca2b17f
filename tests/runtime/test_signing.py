"""ed25519 signatures of engine files: a signed engine loads with its public key, an unsigned,
re-signed-by-another-key or edited one is refused, and the messages are one line."""

from __future__ import annotations

import hashlib
import json
import zipfile

import numpy as np
import pytest

import graphc
import graphc.runtime
import models
from graphc.runtime import EngineError
from graphc.runtime.container import make_comment, parse_comment
from graphc.runtime.signing import sign_engine, signature_of, write_keypair


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("sign")
    m = models.build("mlp", size="tiny")
    feeds = models.sample_inputs("mlp", m)
    eng = graphc.compile(m, target="cpu", shapes={k: v.shape for k, v in feeds.items()})
    eng.save(d / "plain.engine")
    write_keypair(d / "key.pem", d / "pub.pem")
    write_keypair(d / "other.pem", d / "other.pub")
    return d, feeds, eng.run(feeds)


def _copy(d, name):
    p = d / name
    p.write_bytes((d / "plain.engine").read_bytes())
    return p


def test_signed_engine_loads_with_its_key(setup):
    d, feeds, expected = setup
    p = _copy(d, "signed.engine")
    sign_engine(p, d / "key.pem")
    assert signature_of(p) is not None and len(signature_of(p)) == 64
    out = graphc.runtime.load(p, verify_key=d / "pub.pem").run(feeds)
    for k in expected:
        np.testing.assert_array_equal(out[k], expected[k])
    # a signature changes nothing for a user who does not ask for one
    graphc.runtime.load(p).run(feeds)


def test_unsigned_wrong_key_and_edited_engines_are_refused(setup):
    d, *_ = setup
    with pytest.raises(EngineError, match="not signed"):
        graphc.runtime.load(d / "plain.engine", verify_key=d / "pub.pem")
    p = _copy(d, "other.engine")
    sign_engine(p, d / "other.pem")
    with pytest.raises(EngineError, match="does not verify"):
        graphc.runtime.load(p, verify_key=d / "pub.pem")
    # an editor who reseals the manifest digest cannot forge the signature over it
    p = _copy(d, "edited.engine")
    sign_engine(p, d / "key.pem")
    with zipfile.ZipFile(p) as z:
        items = [(n, z.read(n)) for n in z.namelist()]
        _, sig = parse_comment(z.comment, p)
    m = json.loads(dict(items)["manifest.json"])
    m["report"]["note"] = "edited"
    raw = json.dumps(m).encode()
    with zipfile.ZipFile(p, "w") as z:
        z.comment = make_comment(hashlib.sha256(raw).hexdigest(), sig)
        for n, data in items:
            z.writestr(n, raw if n == "manifest.json" else data)
    graphc.runtime.load(p)  # still a valid engine,
    with pytest.raises(EngineError, match="does not verify"):  # but not the one that was signed
        graphc.runtime.load(p, verify_key=d / "pub.pem")


def test_bad_keys_are_one_line_errors(setup):
    d, *_ = setup
    (d / "junk.pem").write_text("not a key")
    for key, match in ((d / "junk.pem", "not a PEM"), (d / "missing.pem", "cannot read"), (d / "key.pem", "not a PEM")):
        with pytest.raises(EngineError, match=match) as e:
            graphc.runtime.load(d / "plain.engine", verify_key=key)
        assert "\n" not in str(e.value)
    with pytest.raises(EngineError, match="private key"):
        sign_engine(_copy(d, "x.engine"), d / "pub.pem")


def test_missing_cryptography_names_what_to_install(setup, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_crypto(name, *a, **k):
        if name.startswith("cryptography"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_crypto)
    d, *_ = setup
    with pytest.raises(EngineError, match="pip install cryptography"):
        graphc.runtime.load(d / "plain.engine", verify_key=d / "pub.pem")


def test_cli_sign_and_verify_key(setup, capsys):
    from graphc.cli import main

    d, *_ = setup
    p = _copy(d, "cli.engine")
    assert main(["run", str(p), "--verify-key", str(d / "pub.pem")]) != 0
    assert "not signed" in capsys.readouterr().err
    assert main(["sign", str(p), "--key", str(d / "key.pem")]) == 0
    assert "signed" in capsys.readouterr().out
    assert main(["run", str(p), "--verify-key", str(d / "pub.pem")]) == 0
    assert main(["inspect", str(p), "--verify-key", str(d / "other.pub")]) != 0
    err = capsys.readouterr().err
    assert "does not verify" in err and "Traceback" not in err
