#!/bin/bash
# Issue 22, call 68: GPU tests of the tree (the review refactors of session 15 untested on a GPU until now, the
# row-block grid's rank-split LoRA epilogue PRE 1 / 2, the norm + LoRA kernel's rstd in wide chunks), then the LoRA
# down-product kernels before / after the rstd change (bench_lora, 1 and 8 rows) and the epilogue probe.
# Usage (repository root): git show 16d90b6:qerl_kernels/decode.py > results/measured/h100/kernels/epi_call68/
# decode_before.py (the kernels before the rstd change), then bash results/measured/h100/kernels/epi_call68/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
D=results/measured/h100/kernels/epi_call68
OUT=${OUT:-/tmp/epi68-out}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[call68 +$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/env.txt"
stamp "probe"
timeout 150 python3 $D/probe.py > "$OUT/probe.log" 2>&1; grep -c pass "$OUT/probe.log"
stamp "tests"
timeout 150 python3 -m pytest -q -rfE -x tests/qerl_kernels/test_fp4_mma.py tests/qerl_kernels/test_decode.py \
  -p no:cacheprovider > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
stamp "bench_lora after"
timeout 100 python3 -m qerl_kernels.bench_lora --rows 1 8 --splits 16 --md "$OUT/lora_after.md" > /dev/null 2>&1
stamp "bench_lora before"
timeout 100 python3 -m qerl_kernels.bench_lora --rows 1 8 --splits 16 --decode-file $D/decode_before.py \
  --md "$OUT/lora_before.md" > /dev/null 2>&1
stamp done
