#!/bin/bash
# Issue 22, call 87: the row-block grid's XS knob (x staged in shared memory once a program) at M = 2 / 4 / 8 on the
# 7B launches beside the grid without it and the default path; the split LoRA kernels at 1-8 rows (bench_lora).
# Usage (repository root): bash results/measured/h100/kernels/xs_call87/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/xs87-out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/env.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/qerl_kernels/test_fp4_mma.py > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
T="python3 -m qerl_kernels.tune --mma --rows-only --m 2 4 8 --passes 2"
{ timeout 150 $T --shapes 37888x3584 --epilogue none \
    --rows-knobs KW=4,CPB=3,MAXNREG=96,XS=1 KW=4,CPB=3,MAXNREG=96 KW=2,CPB=12,MAXNREG=80 KW=4,CPB=4,MAXNREG=96,XS=1
  timeout 100 $T --shapes 4608x3584 --epilogue bias \
    --rows-knobs KW=4,CPB=4,MAXNREG=96,XS=1 KW=4,CPB=4,MAXNREG=96
  timeout 100 $T --shapes 3584x3584 --epilogue lora \
    --rows-knobs KW=8,CPB=2,MAXNREG=104,XS=1 KW=8,CPB=3,MAXNREG=88,PRE=1 KW=8,CPB=3,MAXNREG=104,XS=1; } \
  > "$OUT/probe.log" 2>&1
grep -E "default path|mma-rows|rror" "$OUT/probe.log" | tail -70
timeout 120 python3 -m qerl_kernels.bench_lora --models 7B --rows 1 2 4 8 --splits \
  --out "$OUT/lora.json" --md "$OUT/lora.md" > "$OUT/lora.log" 2>&1
cat "$OUT/lora.md"; tail -3 "$OUT/lora.log"
