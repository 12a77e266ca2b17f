#!/usr/bin/env bash
# One device call for the PDL work (docs/launches.md): the runtime GPU tests, engine.run's host
# overhead, and tools/bench_pdl.py (BERT-base, GPT-2, ResNet-50 exports at batch 1 and 32, PDL
# against plain launches). Writes under $OUT; each step has its own time limit so one cannot eat
# the others' (HOST_S, TESTS_S, EXPORT_WAIT_S; 0 skips a step); the bench gets what is left of
# DEADLINE_S (the device call's limit less a margin), its rows written one by one.
#
#   OUT=dir [MODELS=bert,gpt2,resnet50] [BATCH=1,32] bash tools/gpu_pdl_session.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=4
log="$OUT/session.log"
HOST_S=${HOST_S:-25} TESTS_S=${TESTS_S:-60} EXPORT_WAIT_S=${EXPORT_WAIT_S:-40} DEADLINE_S=${DEADLINE_S:-150}
MODELS=${MODELS:-bert,gpt2,resnet50} BATCH=${BATCH:-1,32}
SECONDS=0
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, numpy, cupy; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__)"
  python3 -c "import cuda.bindings; from cuda.bindings import nvrtc; print('cuda-bindings', cuda.bindings.__version__, 'nvrtc', nvrtc.nvrtcVersion()[1:])"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$log" 2>&1
WHL=${WHL:-.whl}
if ls "$WHL"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl >> "$log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$log" 2>&1 || { cat "$log"; exit 1; }
echo "installed in ${SECONDS}s" >> "$log"

# the exports (CPU) while the tests run
mkdir -p /tmp/exports
pids=()
for m in ${MODELS//,/ }; do
  case $m in *:*) continue ;; esac  # a zoo model needs no export
  python3 tools/export_torch.py --out /tmp/exports --models "$m" --exporter torchscript > "/tmp/exports/$m.log" 2>&1 &
  pids+=($!)
done

step() {  # step NAME LIMIT OUTPUT COMMAND...
  local name=$1 limit=$2 output=$3 t0=$SECONDS
  shift 3
  [ "$limit" = 0 ] && { echo "$name: skipped" >> "$log"; return; }
  timeout "$limit" "$@" > "$output" 2>&1
  echo "$name: rc=$? in $((SECONDS - t0))s; $(tail -1 "$output")" >> "$log"
}
step "host overhead" "$HOST_S" "$OUT/host_overhead.txt" python3 tools/bench_host_overhead.py --calls 2000 --rounds 7 --json "$OUT/host_overhead.json"
step "gpu tests" "$TESTS_S" "$OUT/gpu_tests.log" python3 -m pytest -m gpu -p no:cacheprovider -n 8 -rfE tests/runtime
t0=$SECONDS
for p in "${pids[@]}"; do
  left=$((EXPORT_WAIT_S - (SECONDS - t0)))
  [ $left -gt 0 ] && timeout $left tail --pid="$p" -f /dev/null
done
for m in ${MODELS//,/ }; do [ -f "/tmp/exports/$m.log" ] && echo "export $m: $(tail -1 /tmp/exports/$m.log)" >> "$log"; done
BENCH_S=$((DEADLINE_S - SECONDS - 3))
[ $BENCH_S -lt 1 ] && BENCH_S=1
step "bench pdl" "$BENCH_S" "$OUT/bench_pdl.log" python3 tools/bench_pdl.py --exports /tmp/exports --models "$MODELS" --batch "$BATCH" --json "$OUT/pdl.json" --md "$OUT/pdl.md"
echo "total ${SECONDS}s" >> "$log"
