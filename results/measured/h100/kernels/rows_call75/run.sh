#!/bin/bash
# Issue 22, call 75: the row-block grid's knobs on the 7B down launch at M = 1, split (probe.py).
# Usage (repository root): bash results/measured/h100/kernels/rows_call75/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/rows75-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/env.txt"
timeout 400 python3 results/measured/h100/kernels/rows_call75/probe.py > "$OUT/probe.log" 2>&1
grep -c pass "$OUT/probe.log"; tail -2 "$OUT/probe.log"
