# The two commands of the README. Both create .venv (once) and install graphc into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint conformance install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,nvrtc]'

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
