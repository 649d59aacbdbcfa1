#!/bin/bash
# Issue 22, call 85: the M = 2 / 4 table entries of call 84 in the 7B rollout (QeRL and BF16 LoRA at batch 1, 2, 4 on
# one lease), after the MMA kernel's GPU tests.
# Usage (repository root, .whl/ carried): COMMIT=... bash results/measured/h100/kernels/rollout_call85/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/rollout85-out}
mkdir -p "$OUT"
timeout 120 python3 -m pytest tests/qerl_kernels/test_fp4_mma.py -q -n 4 -p no:cacheprovider 2>&1 | tail -3 \
  | tee "$OUT/pytest-mma.log"
W=/tmp/rollout85-work PROF_S=200 BUDGET=150 bash qerl/profiling/run_device.sh --methods qerl lora --ranks 32 \
  --batches 1 2 4 --full-batches --e2e-batches
cp /tmp/rollout85-work/prof/rollout.csv /tmp/rollout85-work/prof/env.txt "$OUT/"
