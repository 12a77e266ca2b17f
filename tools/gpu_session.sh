#!/usr/bin/env bash
# One batched session on a GPU machine: environment, GPU tests, tiny zoo models, PyTorch exports on
# CUDA (compile, save, load, compare with ONNX Runtime, bench), GEMM bench, and whole models against
# PyTorch eager / torch.compile. Writes at most 8 files under $OUT (the device tool returns 8).
#
#   OUT=dir [PRECISIONS=fp16,fp32,bf16] [EXPORTER=torchscript|dynamo|both] [ARCH=sm_90] bash tools/gpu_session.sh
#
# Each step has a time limit in seconds (TESTS_S, ZOO_S, EXPORTS_S, GEMM_S, SM90_S, PROF_S, TORCH_S, QUANT_S, HOST_S,
# TACTICS_S, TAILS_S, ATT_S, INT8_S, FP8_S, FP8_ENGINE_S); 0 skips the
# step. The defaults (130+70+170+40, TORCH_S=0) fit one 10-minute device call; a comparison with
# PyTorch alone: TESTS_S=0 ZOO_S=0 EXPORTS_S=0 GEMM_S=0 TORCH_S=400 (about 5 minutes); TORCH_MODELS
# picks models (five take ~310 s with --quick), TORCH_ARGS adds bench_torch flags, e.g. the
# 2026-12-01 20:13 figures: TORCH_ARGS="--tactics cublaslt --io-precision fp16"; an A/B of a compile option
# that is off by default, e.g. the 2026-12-03 row-norm runs: TORCH_ARGS="--graphc-option row_norm_epilogues=true".
# The 2026-12-04 mid-M GEMM sweep (1024 rows, every tile width and split): SM90_S=60 SM90_ARGS="--mid
# --layout k" (add --epilogue bias-res or bias-gelu, --shape MxNxK for other rows); BERT-base and GPT-2
# at batch 4-16: TORCH_S=300 TORCH_MODELS=bert,gpt2 TORCH_ARGS="--batch 8,4,16 --modes eager,default,reduce-overhead
# --io-precision fp16" (a flag given wins over --quick).
# (pytest gets no -q: pyproject's addopts has one, and -qq drops the "N passed" line.)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=4
log="$OUT/session.log"
TESTS_S=${TESTS_S:-130} ZOO_S=${ZOO_S:-70} EXPORTS_S=${EXPORTS_S:-170} GEMM_S=${GEMM_S:-40} TORCH_S=${TORCH_S:-0}
QUANT_S=${QUANT_S:-0} SM90_S=${SM90_S:-0} PROF_S=${PROF_S:-0}
HOST_S=${HOST_S:-0} TACTICS_S=${TACTICS_S:-0} TAILS_S=${TAILS_S:-0}

# step NAME LIMIT OUTPUT COMMAND...: runs COMMAND under `timeout LIMIT`, stdout and stderr to OUTPUT,
# unless LIMIT is 0; logs how it ended and OUTPUT's last line.
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

{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, numpy, cupy, onnx, onnxruntime; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'onnx', onnx.__version__, 'ort', onnxruntime.__version__)"
  python3 -c "from cuda.bindings import nvrtc; print('nvrtc', nvrtc.nvrtcVersion()[1:])"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$log" 2>&1
# Packages the GPU image lacks (graphc's own dependencies such as platformdirs) travel as wheels in
# .whl (carry=[".whl"]; fetched here by `make gpu-wheels`).
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >> "$log" 2>&1 || { cat "$log"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$log" 2>&1 || { cat "$log"; exit 1; }
python3 -c "import graphc.codegen" >> "$log" 2>&1 || { cat "$log"; exit 1; }

# PyTorch exports in the background while the tests run.
export_pids=()
if [ "$EXPORTS_S" != 0 ] || [ "$QUANT_S" != 0 ] || [ "$PROF_S" != 0 ]; then
  mkdir -p /tmp/exports
  for m in resnet50 mobilenetv2 bert vit gpt2; do
    timeout ${EXPORT_S:-240} python3 tools/export_torch.py --out /tmp/exports --models $m --exporter ${EXPORTER:-torchscript} \
      > /tmp/exports/$m.log 2>&1 &
    export_pids+=($!)
  done
fi
# TESTS_SEL: test paths instead of the whole suite (about 126 s with -n 8 on the H200).
step "gpu tests" "$TESTS_S" "$OUT/gpu_tests.log" python3 -m pytest -m gpu -p no:cacheprovider -n 8 -rfE ${TESTS_SEL:-tests}
step "zoo tiny" "$ZOO_S" /tmp/zoo.log python3 tools/check_models.py --zoo tiny --target cuda --precision fp32,fp16,bf16 \
  --out "$OUT/zoo_tiny_cuda.md"
if [ ${#export_pids[@]} != 0 ]; then
  wait "${export_pids[@]}"  # the exports must be complete before they are checked
  cat /tmp/exports/*.log | grep -E "ok|FAIL|Error" | tail -10 >> "$log"
fi
step "exports" "$EXPORTS_S" "$OUT/exports.log" python3 tools/check_models.py --exports /tmp/exports --target cuda \
  --precision ${PRECISIONS:-fp16,fp32} ${ARCH:+--arch $ARCH} --bench --iterations 50 --out "$OUT/exports_cuda.md"
# Where the GPU time goes per kernel (graphc's steps and PyTorch eager's kernels); needs the exports.
step "profile" "$PROF_S" /tmp/prof.log python3 tools/profile_kernels.py --exports /tmp/exports \
  --models ${PROF_MODELS:-bert,gpt2,resnet50} --batch 1,32 --top 8 --out "$OUT/profile_kernels.md"
step "gemm bench" "$GEMM_S" "$OUT/bench_gemm.txt" python3 tools/bench_gemm.py --quick
# The Hopper TMA GEMM's variants against cuBLAS (sm_90 only; about 3 minutes for every shape).
# SM90_ARGS picks shapes and forms, e.g. the 2026-12-03 LM-head and narrow-MLP sweeps (13 s, 8 s):
#   SM90_ARGS="--sweep --shape 4096x50257x768 --shape 128x50257x768 --layout k"
#   SM90_ARGS="--lean --shape 100352x384x96 --shape 100352x96x384 --layout k --layout mn"
step "sm90 gemm bench" "$SM90_S" "$OUT/bench_gemm_sm90.txt" python3 tools/bench_gemm_sm90.py --out /tmp/sm90 ${SM90_ARGS:-}
# Like for like (tools/bench_torch.py): both sides through the ordinary call and as graph replays.
step "against PyTorch" "$TORCH_S" /tmp/vs_torch.log python3 tools/bench_torch.py --quick ${TORCH_MODELS:+--models $TORCH_MODELS} $TORCH_ARGS \
  --budget-s $(( TORCH_S > 90 ? TORCH_S - 60 : TORCH_S )) --out "$OUT/vs_torch.md" --json "$OUT/vs_torch.json"
# Written on 2026-12-01 evening and never run on a GPU (the device was not lent again): engine.run's
# host overhead after the exact-feed fast path and the copies captured into the graph (target
# <= 10 us at batch 1), and the cuBLASLt tactic's per-shape comparison then whole models with its
# winners. HOST_S=40 TACTICS_S=170 (with TESTS_S, which runs their -m gpu tests, first).
step "host overhead" "$HOST_S" "$OUT/host_overhead.log" python3 tools/bench_host_overhead.py --json "$OUT/host_overhead.json"
step "tactics" "$TACTICS_S" "$OUT/tactics.log" python3 tools/bench_tactics.py --ms 4096,128,6304,197,1024 --then-models \
  --batches 32,1 --out "$OUT/tactics_shapes.jsonl" --models-out "$OUT/tactics_models.jsonl" --cache-dir /tmp/gcc
# Kernel benches against the vendor libraries in the same run (2026-12-02): the sm_90 attention
# kernel's done-when cases against every SDPA backend, int8 (TMA) against fp16 GEMMs, FP8 against
# torch._scaled_mm. ATT_S=45 INT8_S=60 FP8_S=30 (default 0: off).
step "attention bench" "${ATT_S:-0}" "$OUT/attention.txt" python3 tools/bench_attention.py --done-when --iters 30
step "int8 bench" "${INT8_S:-0}" /tmp/int8_bench.log python3 tools/bench_int8.py --quick --iterations 30 --workers 14 --out "$OUT/int8.md"
step "fp8 bench" "${FP8_S:-0}" /tmp/fp8_bench.log python3 tools/bench_fp8.py --iterations 50 --out "$OUT/fp8.md"
# An fp8 engine (--precision fp8) against the CPU fp8 engine and the fp16 engine (2026-12-03; ~10 s).
step "fp8 engine" "${FP8_ENGINE_S:-0}" "$OUT/fp8_engine.log" python3 tools/bench_fp8_engine.py --out "$OUT/fp8_engine.json"
# ResNet-50's batch-22 cliff: static engines at batch 8-32 with conv_sm90.TAIL_BASE values (~60 s).
step "conv tails" "$TAILS_S" "$OUT/conv_tails.log" python3 tools/bench_conv_tails.py \
  --engines 22@1.0,20@1.0,22@0.6,22@0.3,22@0.0,24@1.0,24@0.3,16@1.0,16@0.3,32@1.0,32@0.3 --jobs 16 --work /tmp/ct \
  --out-md "$OUT/conv_tails.md" --out-json "$OUT/conv_tails.json"
# QDQ-quantized exports as CUDA engines (fp32) against the Q/DQ definition; needs the exports above.
step "quantized" "$QUANT_S" /tmp/quantized.log python3 tools/check_quantized.py --exports /tmp/exports --target cuda
[ "$QUANT_S" != 0 ] && cat /tmp/quantized.log | grep "^|" >> "$log"
# Written on 2026-12-04 and not run (the device was withdrawn): GEMM cluster kernels under PDL
# (runtime/pdl.py GRAPHC_PDL_CLUSTERS=1). PDL_CLUSTER_S=150 runs their engine GPU test, the PDL probe,
# the conv cluster's variants (expected: pdl wrong, plain right) and the batch-1 A/B of each rule with
# plain and programmatic GEMM clusters on the zoo's BERT-base and ViT-B/16 (docs/launches.md says what
# to flip when programmatic clusters and DEEP_K_CLUSTER win). The row-norm epilogues meet issue 11's
# batch-1 launch targets (BERT-base 66, GPT-2 64: tools/count_launches.py --row-norm-epilogues) but were
# 10-17% slower with their cluster GEMMs launched plain; under PDL: GRAPHC_PDL_CLUSTERS=1 TORCH_S=300
# TORCH_MODELS=bert,gpt2,vit TORCH_ARGS="--batch 1 --modes eager --io-precision fp16 --graphc-option
# row_norm_epilogues=true" against the same with =false.
step "pdl cluster tests" "${PDL_CLUSTER_S:-0}" "$OUT/pdl_cluster_tests.log" python3 -m pytest -m gpu -p no:cacheprovider -rfE \
  tests/codegen/test_gemm_cluster_gpu.py tests/codegen/test_conv_serial_split_gpu.py
step "pdl probe" "${PDL_CLUSTER_S:-0}" /tmp/pdl_probe.log python3 tools/probe_pdl_cluster.py --replays 100
step "conv cluster pdl" "${PDL_CLUSTER_S:-0}" "$OUT/conv_cluster_pdl.log" bash -c \
  'for v in plain pdl; do python3 tools/probe_conv_cluster_pdl.py $v; done'
step "small-M rule A/B" "${PDL_CLUSTER_S:-0}" "$OUT/small_m_rule.log" bash -c \
  "python3 tools/bench_small_m_rule.py --model bert --json $OUT/small_m_rule.jsonl && python3 tools/bench_small_m_rule.py --model vit --json $OUT/small_m_rule.jsonl"
# The LayerNorm fold's kernel (docs/layernorm_fold.md step 1; written 2026-12-04, not run): its GPU
# test against float64, then the one launch against the engine's LayerNorm + GEMM (plain and with
# GEMM clusters under PDL) at BERT's / ViT's batch-1 QKV and FFN1 shapes. LNFOLD_S=90.
step "lnfold tests" "${LNFOLD_S:-0}" "$OUT/lnfold_tests.log" python3 -m pytest -m gpu -p no:cacheprovider -rfE \
  tests/codegen/test_gemm_lnfold_gpu.py
step "lnfold bench" "${LNFOLD_S:-0}" "$OUT/lnfold_bench.log" python3 tools/bench_lnfold.py --json "$OUT/lnfold_bench.json"
exit 0
