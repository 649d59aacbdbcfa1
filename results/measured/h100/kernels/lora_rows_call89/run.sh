#!/bin/bash
# Issue 22, call 89: decode.LORA_SPLIT_MAX_ROWS by group (q/k/v 2, o 8, gate/up 4, down 4; call 88's bench_lora) in
# the 7B rollout at batch 2 / 4 / 8, QeRL and BF16 LoRA, against every limit at 1 (QERL_LORA_SPLIT_ROWS) on one
# lease; then the GRPO steps at batch 2 / 4 / 8 with the new limits (run_device.sh resumes the rollout rows).
# Usage (repository root, .whl/ carried): bash results/measured/h100/kernels/lora_rows_call89/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/lora89-out}
mkdir -p "$OUT"
A=(--methods qerl lora --ranks 32 --batches 2 4 8 --full-batches)
QERL_LORA_SPLIT_ROWS=q/k/v=1,o=1,gate/up=1,down=1 OUT=/tmp/lora89-prof-one W=/tmp/lora89-one PROF_S=150 BUDGET=130 \
  bash qerl/profiling/run_device.sh "${A[@]}" --e2e-batches > "$OUT/profile_one.log" 2>&1
grep -E "tokens_per_s" "$OUT/profile_one.log" | cut -c1-150
OUT=/tmp/lora89-prof-new W=/tmp/lora89-new PROF_S=400 BUDGET=370 \
  bash qerl/profiling/run_device.sh "${A[@]}" --e2e-batches 2 4 8 > "$OUT/profile_new.log" 2>&1
grep -E "tokens_per_s|step_s" "$OUT/profile_new.log" | cut -c1-150
cp /tmp/lora89-one/prof/rollout.csv "$OUT/rollout_one.csv"
tar czf "$OUT/prof_new.tgz" -C /tmp/lora89-new prof
