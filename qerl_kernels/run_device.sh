#!/bin/bash
# One call on a GPU machine (the device tool): install carried wheels (.whl/: bitsandbytes), compile every kernel
# variant in parallel, run the GPU kernel tests, the benchmark (correctness checks on the first model's shapes, then
# timings at every M) and, with NCU=1, an ncu profile of the tuned forward and backward kernels at M = 1 and 128.
# Everything is written to $W (default /tmp/kernels-out): kernels.{csv,summary.md,png,provenance.md}, bench.log,
# pytest.log, ncu.log; then packed into $OUT/kernels.tgz with kernels.summary.md beside it (the device tool returns
# at most 8 files).
# Usage: COMMIT=$(git rev-parse HEAD) MODELS=7B BUDGET=150 NCU=1 bash qerl_kernels/run_device.sh
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/kernels-out}
W=${W:-/tmp/kernels-work}
mkdir -p "$OUT" "$W"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  | tee "$W/bench.log"
python3 -m qerl_kernels.bench --prewarm "${PREWARM:-15}" --prewarm-only 2>&1 | tail -20 | tee -a "$W/bench.log"
timeout "${PYTEST_S:-200}" python3 -m pytest tests/qerl_kernels -q -rfE -x ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 \
  | tee "$W/pytest.log" | tail -15
CMD="python -m qerl_kernels.bench --models ${MODELS:-7B} --budget-s ${BUDGET:-150}"
TRITON_PRINT_AUTOTUNING=1 python3 -m qerl_kernels.bench --models ${MODELS:-7B} --out "$W" \
  --budget-s "${BUDGET:-150}" --commit "${COMMIT:-unknown}" --command "$CMD" 2>&1 | tee -a "$W/bench.log" | tail -45
if [ -n "$NCU" ] && command -v ncu >/dev/null; then
  timeout "${NCU_S:-120}" ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy \
    --metrics smsp__inst_executed.sum,dram__bytes_read.sum \
    python3 -m qerl_kernels.tune --shapes 37888x3584 3584x18944 --m 1 128 --path tc --profile > "$W/ncu.log" 2>&1
  grep -E "_fp4_gemm|Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|Registers Per|Achieved Active" \
    "$W/ncu.log" | head -40
fi
cp "$W/kernels.summary.md" "$OUT/" 2>/dev/null
tar czf "$OUT/kernels.tgz" -C "$W" .
