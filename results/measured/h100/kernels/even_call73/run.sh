#!/bin/bash
# Issue 22, call 73: the row-block grid's unmasked loads (EVEN_U): the probe (probe.py), then the GPU tests of the
# MMA kernel, the default path's FP4 GEMM and its prepared layouts, the skinny-M kernel and the decode kernels; the
# 7B step trace with the table (the default) and without it (QERL_FP4_MMA=0), and the rollout profile (with the
# engine's GPU tests), same machine.
# Usage (repository root, .whl/ carried): COMMIT=... bash results/measured/h100/kernels/even_call73/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
D=results/measured/h100/kernels/even_call73
OUT=${OUT:-/tmp/even73-out}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[call73 +$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/env.txt"
stamp "probe"
timeout 120 python3 $D/probe.py > "$OUT/probe.log" 2>&1; grep -c pass "$OUT/probe.log"
stamp "tests"
timeout 170 python3 -m pytest -q -rfE -n 4 tests/qerl_kernels/test_fp4_mma.py tests/qerl_kernels/test_kernels_fp4.py \
  tests/qerl_kernels/test_kernels_prepared.py tests/qerl_kernels/test_fp4_gemv.py tests/qerl_kernels/test_decode.py \
  -p no:cacheprovider > "$OUT/pytest.log" 2>&1; tail -4 "$OUT/pytest.log"
for mode in default 0; do
  stamp "trace QERL_FP4_MMA=$mode"
  env $( [ $mode = 0 ] && echo QERL_FP4_MMA=0 ) timeout 150 python3 -m qerl.profiling.step_trace --arch 7B \
    --methods lora qerl --batches 1 8 --span 1024 --out "/tmp/trace$mode.json" --md "$OUT/trace_mma$mode.md" 2>&1 \
    | grep -E "^\| " | head -8
done
stamp "profile (default)"
COMMIT=$COMMIT TESTS=1 TESTS_S=200 ARCHS=7B BUDGET=${BUDGET:-60} PROF_S=${PROF_S:-110} OUT=/tmp/pout W=/tmp/pw \
  bash qerl/profiling/run_device.sh --methods qerl lora --ranks 32 --batches 1 8 --full-batches --e2e-batches 2>&1 \
  | grep -E "tokens_per_s|passed|failed" | cut -c1-170
cp /tmp/pw/prof/rollout.csv "$OUT/rollout.csv"; cp /tmp/pw/pytest-engine.log "$OUT/"
stamp done
