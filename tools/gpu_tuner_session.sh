#!/usr/bin/env bash
# One GPU call for issue 11 items 1, 4 and 5 (bench_torch's (b), the tuner, engine.run's host overhead):
# their GPU tests, the host overhead at batch 1, and --tune fast against untuned on full-size models.
#
#   OUT=dir bash tools/gpu_tuner_session.sh      # about 8 minutes; writes 5 files under $OUT
#
# Step limits in seconds (0 skips a step): TESTS_S=170 HOST_S=50 TUNE_S=330; TUNE_MODELS=resnet,bert,
# TUNE_BATCH=1,32. Install as tools/gpu_session.sh does (wheels from .whl or ../../.whl, then -e .).
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=4
log="$OUT/session.log"
TESTS_S=${TESTS_S:-170} HOST_S=${HOST_S:-50} TUNE_S=${TUNE_S:-330}

step() {
  local name=$1 limit=$2 output=$3
  shift 3
  if [ "$limit" = 0 ]; then
    echo "$name: skipped" | tee -a "$log"
    return
  fi
  SECONDS=0
  timeout "$limit" "$@" > "$output" 2>&1
  echo "$name: rc=$? in ${SECONDS}s; $(tail -1 "$output")" | tee -a "$log"
}

{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$log" 2>&1
for w in .whl ../../.whl; do
  if ls $w/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $w/*.whl \
      >> "$log" 2>&1 || { cat "$log"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    break
  fi
done
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$log" 2>&1 || { cat "$log"; exit 1; }

step "gpu tests" "$TESTS_S" "$OUT/gpu_tests.log" python3 -m pytest -m gpu -p no:cacheprovider -n 4 -rfE \
  tests/codegen/test_tuner_gpu.py tests/runtime/test_cuda_run_path_gpu.py tests/runtime/test_cuda_gpu.py \
  tests/tools/test_bench_torch.py
step "host overhead bert" "$HOST_S" "$OUT/host_overhead.txt" python3 tools/bench_host_overhead.py --model bert \
  --json "$OUT/host_overhead.json"
step "tune vs untuned" "$TUNE_S" "$OUT/check_tuning.txt" python3 tools/check_tuning.py \
  --models "${TUNE_MODELS:-resnet,bert}" --batch "${TUNE_BATCH:-1,32}" --json "$OUT/check_tuning.json"
exit 0
