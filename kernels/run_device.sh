#!/bin/bash
# One call on a GPU machine (the device tool): install bitsandbytes from .whl/, compile every kernel variant, run the
# GPU tests, the benchmark (correctness checks on the first model's shapes, then timings) and an ncu profile of the
# tuned forward and backward kernels. Everything goes to $OUT: gpu/kernels.{csv,summary.md,png,provenance.md},
# bench.log, pytest.log, ncu.log. Usage: COMMIT=$(git rev-parse HEAD) BUDGET=150 bash kernels/run_device.sh
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/kernels-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  | tee "$OUT/bench.log"
python3 -m kernels.bench --prewarm 15 --prewarm-only 2>&1 | tail -20 | tee -a "$OUT/bench.log"
timeout "${PYTEST_S:-240}" python3 -m pytest tests/kernels -q -rfE 2>&1 | tee "$OUT/pytest.log" | tail -15
CMD="python -m kernels.bench --models ${MODELS:-7B 3B 14B 32B} --budget-s ${BUDGET:-150}"
TRITON_PRINT_AUTOTUNING=1 python3 -m kernels.bench --models ${MODELS:-7B 3B 14B 32B} --out "$OUT/gpu" \
  --budget-s "${BUDGET:-150}" --commit "${COMMIT:-unknown}" --command "$CMD" 2>&1 | tee -a "$OUT/bench.log" | tail -60
if command -v ncu >/dev/null; then
  timeout "${NCU_S:-90}" ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy \
    --metrics smsp__inst_executed.sum,dram__bytes_read.sum \
    python3 -m kernels.tune --shapes 37888x3584 4608x3584 --m 1 --profile > "$OUT/ncu.log" 2>&1
  grep -E "_fp4_gemm|Duration|DRAM Throughput|Issued Warp|Eligible Warps|Registers Per|Achieved Active|inst_executed|dram__bytes" \
    "$OUT/ncu.log" | head -40
fi
