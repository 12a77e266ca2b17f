#!/usr/bin/env bash
# One batched session on a GPU machine: environment, GPU tests, zoo models, PyTorch exports on CUDA in
# fp32/fp16 (compile, save, load, compare with ONNX Runtime, bench), GEMM bench. Writes under $OUT
# (at most 8 files). Usage: OUT=dir [PRECISIONS=fp16,fp32,bf16] [EXPORTER=both] [ARCH=sm_90] bash tools/gpu_session.sh
# Each step's time limit is a variable (TESTS_S, ZOO_S, EXPORTS_S, GEMM_S); 0 skips the step.
# (pytest gets no -q: pyproject's addopts has one, and -qq drops the "N passed" line.)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=4
log="$OUT/session.log"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, numpy, cupy, onnx, onnxruntime; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__)"
  python3 -c "from cuda.bindings import nvrtc; print('nvrtc', nvrtc.nvrtcVersion()[1:])"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$log" 2>&1 || { cat "$log"; exit 1; }
# PyTorch exports (TorchScript exporter, opset 17) in the background while the tests run.
mkdir -p /tmp/exports
export_pids=()
for m in resnet50 mobilenetv2 bert vit gpt2; do
  timeout ${EXPORT_S:-240} python3 tools/export_torch.py --out /tmp/exports --models $m --exporter ${EXPORTER:-torchscript} \
    > /tmp/exports/$m.log 2>&1 &
  export_pids+=($!)
done
SECONDS=0
[ "${TESTS_S:-130}" != 0 ] && timeout ${TESTS_S:-130} python3 -m pytest -m gpu -p no:cacheprovider -n 8 -rfE tests > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: rc=$? in ${SECONDS}s; $(tail -1 "$OUT/gpu_tests.log")" | tee -a "$log"
SECONDS=0
[ "${ZOO_S:-70}" != 0 ] && timeout ${ZOO_S:-70} python3 tools/check_models.py --zoo tiny --target cuda --precision fp32,fp16,bf16 \
  --out "$OUT/zoo_tiny_cuda.md" > "$OUT/zoo.log" 2>&1
echo "zoo tiny: rc=$? in ${SECONDS}s; $(tail -1 "$OUT/zoo.log")" | tee -a "$log"
wait "${export_pids[@]}"  # the exports must be complete before they are checked
cat /tmp/exports/*.log | grep -E "ok|FAIL|Error" | tail -10 >> "$log"
SECONDS=0
timeout ${EXPORTS_S:-170} python3 tools/check_models.py --exports /tmp/exports --target cuda --precision ${PRECISIONS:-fp16,fp32} ${ARCH:+--arch $ARCH} \
  --bench --iterations 50 --out "$OUT/exports_cuda.md" --json "$OUT/exports_cuda.json" > "$OUT/exports.log" 2>&1
echo "exports: rc=$? in ${SECONDS}s; $(tail -1 "$OUT/exports.log")" | tee -a "$log"
SECONDS=0
[ "${GEMM_S:-40}" != 0 ] && timeout ${GEMM_S:-40} python3 tools/bench_gemm.py --quick > "$OUT/bench_gemm.txt" 2>&1
echo "gemm bench: rc=$? in ${SECONDS}s" | tee -a "$log"
tail -12 "$OUT/bench_gemm.txt"
