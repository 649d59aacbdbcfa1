#!/bin/bash
# Issue 22, call 71: the 14B / 32B MEASURED_WINS (call 70) in the default dispatch: a 7B knob probe (probe.py), then
# the 14B and 32B rollouts of QeRL and BF16 LoRA at batch 1 and 8 (32B BF16 LoRA in its own process: beside the
# QeRL model it does not fit, call 42), as calls 42-43 ran them.
# Usage (repository root, .whl/ carried): COMMIT=... bash results/measured/h100/kernels/rollout_call71/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/rollout71-out}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[call71 +$(( $(date +%s) - T0 ))s] $*"; }
stamp "probe"
timeout 100 python3 results/measured/h100/kernels/rollout_call71/probe.py > "$OUT/probe.log" 2>&1
grep -c pass "$OUT/probe.log"
n=0
for spec in "14B:qerl lora" "32B:qerl" "32B:lora"; do
  n=$((n + 1)); arch=${spec%%:*}; methods=${spec#*:}
  stamp "profile $arch $methods"
  COMMIT=$COMMIT ARCHS=$arch BUDGET=200 PROF_S=260 OUT=/tmp/pout$n W=/tmp/pw$n \
    bash qerl/profiling/run_device.sh --methods $methods --ranks 32 --batches 1 8 --full-batches --e2e-batches \
    2>&1 | tee "$OUT/profile.$n.log" | grep -E "tokens_per_s" | cut -c1-150
  cp /tmp/pw$n/prof/rollout.csv "$OUT/rollout.$n.csv"
done
cp /tmp/pw1/prof/env.txt "$OUT/"
stamp done
