#!/usr/bin/env bash
# One batched session on a GPU machine: environment, GPU tests, zoo models on CUDA, quick benchmarks.
# Everything is written under $OUT (default ./out). Usage: bash tools/gpu_session.sh [tests|models|bench|all]
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
what=${1:-all}
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=4
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c "import sys, numpy, cupy, onnx, onnxruntime; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__)"
  python3 -c "from cuda.bindings import nvrtc; print('nvrtc', nvrtc.nvrtcVersion())"
  python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
if [[ $what == all || $what == tests ]]; then
  timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 120 -rfE tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
fi
if [[ $what == all || $what == models ]]; then
  timeout 240 python3 tools/check_models.py --zoo tiny --target cuda --precision fp32,fp16,bf16 \
    --json "$OUT/zoo_tiny_cuda.json" --out "$OUT/zoo_tiny_cuda.md" 2>&1 | tail -20
fi
if [[ $what == all || $what == bench ]]; then
  timeout 120 python3 tools/bench_gemm.py --quick 2>&1 | tee "$OUT/bench_gemm.txt" | tail -15
  timeout 120 python3 tools/bench_conv.py --quick 2>&1 | tee "$OUT/bench_conv.txt" | tail -15
fi
