# The two commands of the README. Both create .venv (once) and install graphc into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint conformance install gpu-wheels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# pip runs again only when pyproject.toml changed since the last install (the stamp file, one per
# set of extras: on a GPU machine `make install EXTRAS=test,cuda`).
EXTRAS ?= test,nvrtc
STAMP := $(VENV)/.graphc-installed.$(EXTRAS)

install: $(STAMP)

# The editable install maps passes/, codegen/ and runtime/ onto graphc.* with an import hook that
# Python asks last, so from the clone's parent folder (which holds a folder named graphc without
# an __init__.py) `import graphc` would find that folder as an empty namespace package first.
# A .pth entry naming the clone puts the real graphc package on sys.path, where a regular package
# beats a namespace folder wherever it appears; it also makes `python -m models` work anywhere.
# tests/test_packaging.py checks both. setuptools' one notice about this ("Editable installation
# ... folders with the same name") is what the .pth fixes, so it is silenced by its text; any
# other warning still shows.
$(STAMP): pyproject.toml | $(BIN)/python
	PYTHONWARNINGS='ignore:Editable installation' $(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	$(BIN)/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_path('purelib'), '_graphc_clone.pth').write_text(str(pathlib.Path.cwd()) + '\\n')"
	touch $@

# The main job: build a zoo model, compile it (GPU when there is one, else CPU), run it, compare
# with ONNX Runtime, print the report.
demo: install
	$(BIN)/python tools/demo.py

lint: install
	$(BIN)/ruff check .

# The test suite, then the ONNX node tests, as they are and through the optimizer: no case recorded
# as passing in docs/conformance.json may fail.
test: install lint
	OPENBLAS_NUM_THREADS=1 $(BIN)/python -m pytest
	OPENBLAS_NUM_THREADS=1 $(BIN)/python tools/conformance.py --expect docs/conformance.json --quiet
	OPENBLAS_NUM_THREADS=1 $(BIN)/python tools/conformance.py --expect docs/conformance.json --quiet --opt-level 2

conformance: install
	$(BIN)/python tools/conformance.py

# Wheels of the pure dependencies that the GPU machine's image lacks (it has no package index):
# carried to it in .whl by the device tool; tools/gpu_session.sh installs them there.
# nvmath-python: the cuBLASLt tactic's bindings (docs/tactics.md)
GPU_WHEELS ?= platformdirs msgspec nvmath-python
gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(GPU_WHEELS)
