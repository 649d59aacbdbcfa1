#!/bin/bash
# Issue 22, call 74: the row-block grid at M = 8 on the 14B / 32B launches (probe.py), then ncu's warp stall reasons
# of the 7B gate/up and down launches at M = 1 (ncu_rows.py).
# Usage (repository root): bash results/measured/h100/kernels/rows_call74/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
D=results/measured/h100/kernels/rows_call74
OUT=${OUT:-/tmp/rows74-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/env.txt"
timeout 200 python3 $D/probe.py > "$OUT/probe.log" 2>&1; grep -c pass "$OUT/probe.log"
timeout 200 ncu --profile-from-start off --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section SpeedOfLight --print-details all python3 $D/ncu_rows.py > "$OUT/ncu.log" 2>&1; grep -c Stall "$OUT/ncu.log"
