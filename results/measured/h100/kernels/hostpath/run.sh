#!/bin/bash
# Issue 22, call 109: the Gluon kernels' eager launch with the compiled binary reused (qerl_kernels/gluon_launch.py).
# (1) the three Gluon kernels' GPU tests and the launch's own (the cached binary is the JIT's pick, the same bits),
# (2) probe_launch.py (host time a call before / after; every backward path eager and graph-timed; the dispatch's
# pick), (3) the 7B backward benchmark at M 16-512 (call 98's command: the default backward path, timed by the
# dispatch eagerly, beside bf16 and the kernel). Writes $OUT/pytest.log, probe.log, bench.log, kernels.summary.md,
# kernels.csv, kernels.provenance.md. Usage (repository root): COMMIT=... bash .../hostpath/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1 TRITON_CACHE_DIR=/tmp/tc
OUT=${OUT:-/tmp/out}; W=/tmp/hostpath; mkdir -p "$OUT" "$W"
D=results/measured/h100/kernels/hostpath
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/probe.log"
echo "commit ${COMMIT:-unknown} date $(date -u +%FT%TZ)" | tee -a "$OUT/probe.log"
timeout -k 10 ${PYTEST_S:-240} python3 -m pytest tests/qerl_kernels/test_gluon_launch.py \
  tests/qerl_kernels/test_kernels_wgmma_t.py tests/qerl_kernels/test_kernels_wgmma.py \
  tests/qerl_kernels/test_kernels_gluon.py -n 4 -q -rfE -p no:cacheprovider > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -4 "$OUT/pytest.log"
timeout -k 10 ${PROBE_S:-120} python3 "$D/probe_launch.py" 2>&1 | grep -v Warn | tee -a "$OUT/probe.log"
timeout -k 10 ${BENCH_S:-170} python3 -m qerl_kernels.bench --models 7B --m 16 64 128 256 512 --no-check \
  --skip mxfp4 nf4 nvfp4_gluon nvfp4_gemv mxfp4_gemv nvfp4_mma mxfp4_mma nvfp4_wgmma nvfp4_tc nvfp4_fused \
  nvfp4_deq_cublas nvfp4_bwd_tc --budget-s 120 --out "$W" --commit "${COMMIT:-unknown}" \
  --command "python -m qerl_kernels.bench --models 7B --m 16 64 128 256 512 --no-check --skip mxfp4 nf4 nvfp4_gluon nvfp4_gemv mxfp4_gemv nvfp4_mma mxfp4_mma nvfp4_wgmma nvfp4_tc nvfp4_fused nvfp4_deq_cublas nvfp4_bwd_tc --budget-s 120" \
  > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^N=|layer" "$OUT/bench.log" | tail -30
cp "$W"/kernels.summary.md "$W"/kernels.csv "$W"/kernels.provenance.md "$OUT/" 2>/dev/null
