#!/bin/bash
# Issue 22, call 59: programmatic dependent launch (qerl_kernels.pdl) in the decode step. GPU tests with it on
# (the default), then the 7B step trace and the rollout profile with it on and off (QERL_PDL=0), same machine.
# Usage (repository root, .whl/ carried): COMMIT=... bash results/measured/h100/kernels/pdl_call59/run.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/pdl-out}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[call59 +$(( $(date +%s) - T0 ))s] $*"; }
stamp "pdl + mma tests"
timeout 100 python3 -m pytest -q -rfE tests/qerl_kernels/test_pdl.py tests/qerl_kernels/test_fp4_mma.py \
  -p no:cacheprovider > "$OUT/pdl-pytest.log" 2>&1; tail -3 "$OUT/pdl-pytest.log"
for mode in 1 0; do
  stamp "trace QERL_PDL=$mode"
  QERL_PDL=$mode timeout 150 python3 -m qerl.profiling.step_trace --arch 7B --methods lora qerl --batches 1 8 \
    --span 1024 --out "/tmp/trace$mode.json" --md "$OUT/trace_pdl$mode.md" 2>&1 | grep -E "^\| " | head -8
done
for mode in 1 0; do
  stamp "profile QERL_PDL=$mode"
  [ $mode = 1 ] && T=1 || T=
  QERL_PDL=$mode COMMIT=$COMMIT TESTS=$T TESTS_S=120 ARCHS=7B BUDGET=${BUDGET:-60} PROF_S=${PROF_S:-110} \
    OUT=/tmp/pout$mode W=/tmp/pw$mode bash qerl/profiling/run_device.sh --methods qerl lora --ranks 32 \
    --batches 1 8 --full-batches --e2e-batches 2>&1 | tail -14
  cp /tmp/pw$mode/prof/rollout.csv "$OUT/rollout_pdl$mode.csv" 2>/dev/null
  cp /tmp/pw$mode/pytest-engine.log "$OUT/pytest-engine.log" 2>/dev/null
  cp /tmp/pw$mode/prof/env.txt "$OUT/env.txt" 2>/dev/null
done
stamp done
