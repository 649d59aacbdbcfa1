#!/bin/bash
# Issue 22, call 80: the session's final tree (call 77's with decode.attention_splits' new rule, calls 78-79): the
# 7B step trace with the table (the default) and without it (QERL_FP4_MMA=0), and the rollout profile with the
# engine / decode / fused / skinny-M GPU tests, same machine.
# Usage (repository root, .whl/ carried): COMMIT=... bash results/measured/h100/kernels/final_call80/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/final80-out}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[call80 +$(( $(date +%s) - T0 ))s] $*"; }
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
cp /tmp/pw/prof/rollout.csv "$OUT/rollout.csv"; cp /tmp/pw/pytest-engine.log /tmp/pw/prof/env.txt "$OUT/"
stamp done
