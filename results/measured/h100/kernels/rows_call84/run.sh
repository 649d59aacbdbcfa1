#!/bin/bash
# Issue 22, call 84: the row-block grid at M = 2 and 4 on the 7B launches (batch 2-4 rollouts and the GRPO step's
# sampler run them on the default path), each with the engine's epilogue, beside the default path (qerl_kernels.tune).
# Usage (repository root): bash results/measured/h100/kernels/rows_call84/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/rows84-out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/env.txt"
T="python3 -m qerl_kernels.tune --mma --rows-only --m 2 4 --passes 2"
{ timeout 120 $T --shapes 37888x3584 --epilogue none \
    --rows-knobs KW=2,CPB=12,MAXNREG=80 KW=4,CPB=6,MAXNREG=80 KW=4,CPB=4,MAXNREG=96
  timeout 100 $T --shapes 3584x18944 --epilogue lora \
    --rows-knobs KW=8,CPB=3,MAXNREG=96,PRE=2 KW=4,CPB=4,MAXNREG=96,PRE=2
  timeout 100 $T --shapes 3584x3584 --epilogue lora \
    --rows-knobs KW=8,CPB=3,MAXNREG=88,PRE=1 KW=8,CPB=3,MAXNREG=96,PRE=1
  timeout 100 $T --shapes 4608x3584 --epilogue bias \
    --rows-knobs KW=4,CPB=4,MAXNREG=96 KW=8,CPB=3,MAXNREG=96; } > "$OUT/probe.log" 2>&1
grep -E "default path|mma-rows" "$OUT/probe.log" | tail -60
