#!/bin/bash
# Issue 22, call 79: the decode attention's key splits on the 7B shape (probe.py).
# Usage (repository root): bash results/measured/h100/kernels/attn_call79/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/attn79-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
timeout 200 python3 results/measured/h100/kernels/attn_call79/probe.py > "$OUT/probe.log" 2>&1
grep -c pass "$OUT/probe.log"; tail -3 "$OUT/probe.log"
