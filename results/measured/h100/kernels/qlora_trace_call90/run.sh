#!/bin/bash
# Issue 22, call 90: after call 89's per-group LoRA split limits (decode.LORA_SPLIT_MAX_ROWS): the 7B decode-step
# trace at batch 2 and 4 (QeRL, BF16 LoRA), and QLoRA's rollouts and GRPO steps at batch 2 / 4 / 8 (its LoRA
# down-products take the same kernels), so the 7B profile's batch-2..8 rows are of one engine.
# Usage (repository root, .whl/ carried): bash results/measured/h100/kernels/qlora_trace_call90/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/call90-out}
mkdir -p "$OUT"
OUT=/tmp/call90-prof W=/tmp/call90 TRACE=1 TRACE_BATCHES="2 4" TRACE_S=150 PROF_S=400 BUDGET=360 \
  bash qerl/profiling/run_device.sh --methods qlora --ranks 32 --batches 2 4 8 --full-batches --e2e-batches 2 4 8 \
  > "$OUT/profile.log" 2>&1
grep -E "^\| |^# |tokens_per_s|step_s" "$OUT/profile.log" | cut -c1-170 | tail -60
cp /tmp/call90/trace.md /tmp/call90/trace.json "$OUT/" 2>/dev/null
tar czf "$OUT/prof.tgz" -C /tmp/call90 prof
