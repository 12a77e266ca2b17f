#!/usr/bin/env bash
# The model corpus on the GPU machine in one call (issue 12 item 6): the architecture corpus exported
# there with its own torch (both exporters; tools/make_arch_corpus.py), then tools/check_models.py by
# stage on CUDA: `graphc check --target cuda`, the CUDA engine in fp32 (within 1e-3 of scale) and fp16
# (cosine >= 0.999), one process per model, JOBS at a time; then the committed tests/corpus exports and,
# if TRAINED names a tools/fetch_trained_models.py folder, those models. Fits one 500 s call:
#
#   OUT=dir [JOBS=12] [TRAINED=path/models] [ARCH_MODELS=roberta,resnet] bash tools/gpu_corpus_session.sh
#
# Writes at most 8 files under $OUT (the device tool returns 8): session.log (with the exporters'
# failures), arch_manifest.json, arch_corpus_cuda.{md,json}, and (if run) test_corpus_cuda.{md,json},
# trained_cuda.{md,json}. Each step has a limit in seconds (EXPORT_S=150,
# ARCH_S=180, TESTC_S=70, TRAINED_S=40; 0 skips it; about 20 s of install besides: ~460 s in all): no model starts or
# runs past its step's limit (its row says so) and the table is still written. No internet is needed:
# the configs are built in code.
#
# Off the GPU (here): SKIP_INSTALL=1 EXPORT_PY=/tmp/fusion-torch/bin/python CHECK_PY=.venv/bin/python
# STAGES=interpret,cpu,cuda-check,cuda-compile ARCH_MODELS=roberta,resnet TESTC_MODELS=bert OUT=/tmp/o \
#   bash tools/gpu_corpus_session.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=1
JOBS=${JOBS:-12}  # each check also runs NVRTC on up to every core: fewer jobs than cores
EXPORT_PY=${EXPORT_PY:-python3} CHECK_PY=${CHECK_PY:-python3}
STAGES=${STAGES:-cuda-check,cuda-fp32,cuda-fp16}
EXPORT_S=${EXPORT_S:-150} ARCH_S=${ARCH_S:-180} TESTC_S=${TESTC_S:-70} TRAINED_S=${TRAINED_S:-40}
EXPORT_JOBS=${EXPORT_JOBS:-16}  # an export is one thread
CORPUS=${CORPUS:-/tmp/arch_corpus}
log="$OUT/session.log"
# ARCH_MODELS / TESTC_MODELS / TRAINED_MODELS pick models of each (names, or for tests/corpus model names
# such as bert, or keys)
asel=${ARCH_MODELS:+--models $ARCH_MODELS} tsel=${TESTC_MODELS:+--models $TESTC_MODELS}
rsel=${TRAINED_MODELS:+--models $TRAINED_MODELS}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  $CHECK_PY -c "import sys, numpy, onnx, onnxruntime; print(sys.version.split()[0], 'numpy', numpy.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__)"
  $EXPORT_PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  git log --oneline -1 2>/dev/null || true
} > "$log" 2>&1

# graphc itself, as tools/gpu_session.sh installs it: the wheels the GPU image lacks (carry .whl), then
# an editable install without dependencies.
if [ -z "${SKIP_INSTALL:-}" ]; then
  WHL=${WHL_DIR:-.whl}
  if ls "$WHL"/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl \
      >> "$log" 2>&1 || { cat "$log"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$log" 2>&1 || { cat "$log"; exit 1; }
fi
$CHECK_PY -c "import graphc.codegen" >> "$log" 2>&1 || { cat "$log"; exit 1; }

# step NAME LIMIT COMMAND...: COMMAND under `timeout LIMIT` (0 skips it); logs how it ended.
step() {
  local name=$1 limit=$2
  shift 2
  if [ "$limit" = 0 ]; then
    echo "$name: skipped" | tee -a "$log"
    return
  fi
  SECONDS=0
  timeout "$limit" "$@"
  echo "$name: rc=$? in ${SECONDS}s" | tee -a "$log"
}

# The exports with this machine's torch (a crash of one model is its row; --timeout per model).
[ "$EXPORT_S" = 0 ] || step "arch exports" "$((EXPORT_S + 20))" $EXPORT_PY tools/make_arch_corpus.py --out "$CORPUS" --jobs "$EXPORT_JOBS" \
  --deadline "$EXPORT_S" $asel > /tmp/arch_exports.log 2>&1
[ "$EXPORT_S" = 0 ] && echo "arch exports: skipped" | tee -a "$log"
grep -E "exports ok|^  " /tmp/arch_exports.log 2>/dev/null | head -40 >> "$log"
cp "$CORPUS/manifest.json" "$OUT/arch_manifest.json" 2>/dev/null || true

# check NAME LIMIT OUTBASE SOURCE-ARGS...: check_models by stage; stops starting models 15 s before
# LIMIT so that the table is written.
check() {
  local name=$1 limit=$2 base=$3
  shift 3
  [ "$limit" = 0 ] && { echo "$name: skipped" | tee -a "$log"; return; }
  step "$name" "$((limit + 30))" $CHECK_PY tools/check_models.py "$@" --stages "$STAGES" --jobs "$JOBS" \
    --timeout 150 --deadline $((limit - 15)) --out "$OUT/$base.md" --json "$OUT/$base.json" > "/tmp/$base.log" 2>&1
  grep -E "rows, exported" "/tmp/$base.log" >> "$log"
}
[ -f "$CORPUS/manifest.json" ] && check "arch corpus" "$ARCH_S" arch_corpus_cuda --arch-corpus "$CORPUS" $asel
check "tests/corpus" "$TESTC_S" test_corpus_cuda --test-corpus tests/corpus $tsel
if [ -n "${TRAINED:-}" ] && [ -d "$TRAINED" ]; then
  check "trained" "$TRAINED_S" trained_cuda --trained "$TRAINED" $rsel
else
  echo "trained: no TRAINED folder given, skipped" | tee -a "$log"
fi
exit 0
