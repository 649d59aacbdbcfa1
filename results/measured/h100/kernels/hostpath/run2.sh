#!/bin/bash
# Issue 22, call 111: the cached Gluon launch inside CUDA graphs and in the engine. (1) test_gluon_launch.py on the
# GPU (its graph-capture test included), (2) the 7B backward benchmark with the dispatch's eager timing as a median
# (call 109's command), (3) the 7B rollout of QeRL and BF16 LoRA at batch 128 (rank 32; the decode step's gate/up and
# down through the wgmma kernel, captured in the engine's graphs), one lease. Writes $OUT/pytest.log, bench.log,
# kernels.summary.md, kernels.csv, kernels.provenance.md, profile.tgz. Usage: COMMIT=... bash .../hostpath/run2.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1 TRITON_CACHE_DIR=/tmp/tc
OUT=${OUT:-/tmp/out}; W=/tmp/hostpath; mkdir -p "$OUT" "$W"
timeout -k 10 ${PYTEST_S:-150} python3 -m pytest tests/qerl_kernels/test_gluon_launch.py -n 4 -q -rfE \
  -p no:cacheprovider > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/pytest.log"
timeout -k 10 ${BENCH_S:-150} python3 -m qerl_kernels.bench --models 7B --m 16 64 128 256 512 --no-check \
  --skip mxfp4 nf4 nvfp4_gluon nvfp4_gemv mxfp4_gemv nvfp4_mma mxfp4_mma nvfp4_wgmma nvfp4_tc nvfp4_fused \
  nvfp4_deq_cublas nvfp4_bwd_tc --budget-s 120 --out "$W" --commit "${COMMIT:-unknown}" \
  --command "python -m qerl_kernels.bench --models 7B --m 16 64 128 256 512 --no-check --skip mxfp4 nf4 nvfp4_gluon nvfp4_gemv mxfp4_gemv nvfp4_mma mxfp4_mma nvfp4_wgmma nvfp4_tc nvfp4_fused nvfp4_deq_cublas nvfp4_bwd_tc --budget-s 120" \
  > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -A8 "Issue 15 targets" "$W/kernels.summary.md"
cp "$W"/kernels.summary.md "$W"/kernels.csv "$W"/kernels.provenance.md "$OUT/" 2>/dev/null
ARCHS=7B BUDGET=${BUDGET:-200} PROF_S=${PROF_S:-240} OUT=$OUT LIMIT_S=$(( ${LIMIT_S:-600} - SECONDS )) \
  bash qerl/profiling/run_device.sh --methods qerl lora --ranks 32 --batches 128 --full-batches --e2e-batches
