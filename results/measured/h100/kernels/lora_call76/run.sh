#!/bin/bash
# Issue 22, call 76: ncu of the norm + LoRA down-product kernel at 1 and 8 rows (ncu_lora.py): sections, then the
# SASS with per-instruction stall samples.
# Usage (repository root): bash results/measured/h100/kernels/lora_call76/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
D=results/measured/h100/kernels/lora_call76
OUT=${OUT:-/tmp/lora76-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
timeout 150 ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section SourceCounters \
  --print-details all python3 $D/ncu_lora.py > "$OUT/ncu.log" 2>&1; grep -c Section "$OUT/ncu.log"
timeout 150 ncu --profile-from-start off --section SourceCounters --section WarpStateStats --page source \
  --print-source sass --csv python3 $D/ncu_lora.py > "$OUT/ncu_source.csv" 2>&1; wc -l "$OUT/ncu_source.csv"
