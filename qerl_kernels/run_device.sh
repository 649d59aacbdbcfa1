#!/bin/bash
# One call on a GPU machine (the device tool), <= 8 minutes on one H100, in this order: install carried wheels (.whl/:
# bitsandbytes, optional), the Gluon kernel's offline compile check (qerl_kernels/gluon_compile.py: every variant the
# benchmark and the sweep launch, ok/error, registers, spills, smem; it also fills Triton's cache with those
# binaries), compile every Triton kernel variant in parallel, run the Gluon kernel's tests (issue 22)
# in their own process with a short timeout (a hang, crash or CUDA fault there drops the Gluon kernel from the rest,
# nothing else), the benchmark (bandwidth ceiling = best of several streaming kernels; correctness checks on the first
# model's shapes; timings at M in $MS with nvfp4_gluon beside cuBLAS and the Triton kernels), with NCU=1 ncu of the
# Gluon and Triton kernels on the 7B gate/up group at M = 1 and 16, a sweep of the Gluon kernel's configs
# (tune.py --gluon), and last the other GPU kernel tests. The wgmma kernel (fp4_wgmma) has its own mode (its
# benchmark method, tests and compile check): mode `wgmma` below, which keeps this mode's time as it was.
# Writes to $OUT (<= 8 files, each copied as soon as its stage ends, so a call cut short still returns them):
# gluon-smoke.log (the compile check's table, then the Gluon tests), bench.log, kernels.summary.md, ncu.log (NCU=1),
# tune-gluon.log, pytest.log and kernels.tgz (the whole work folder: kernels.csv and kernels.provenance.md included).
# Stage timeouts (s), 505 in all: COMPILE_S 40, PREWARM_S 40, SMOKE_S 75, BENCH_S 200, NCU_S 45, TUNE_S 60 (0: skip),
# PYTEST_S 45; BUDGET 120 stops the benchmark from starting new shapes.
# Usage: COMMIT=$(git rev-parse HEAD) NCU=1 bash qerl_kernels/run_device.sh
#
# Mode `gemv` (issue 22 item 4; ~3-5 minutes on one H100, nothing else runs): the skinny-M kernel's
# (qerl_kernels/fp4_gemv.py) tests on the GPU, the benchmark of the 7B shapes at M in $MS (default 1 4 8 16) with
# only its correctness checks (bf16 cuBLAS, the default nvfp4 / mxfp4 path and nvfp4_gemv / mxfp4_gemv timed in the
# same run; no Gluon, NF4 or backward), then its knob sweep (tune.py --gemv) at M = 1 and 16 on the 7B gate/up and
# down shapes. Writes to $OUT: gemv-pytest.log, bench.log, kernels.summary.md, kernels.csv, kernels.provenance.md,
# gemv-wins.txt (MEASURED_WINS entries to commit), tune-gemv.log. Stage timeouts (s): PYTEST_S 90, BENCH_S 150,
# TUNE_S 75; BUDGET 110 stops the benchmark from starting new shapes.
# Usage: COMMIT=$(git rev-parse HEAD) bash qerl_kernels/run_device.sh gemv
#
# Mode `mma` (issue 22 item 4; ~3-4 minutes on one H100): the decode-size MMA kernel's (qerl_kernels/fp4_mma.py)
# GPU tests (a hang or CUDA fault there ends the mode), the benchmark of the 7B shapes at M in $MS_MMA (default 1 8)
# with the decode-size kernels' checks (bf16 cuBLAS, the default path, nvfp4_gemv and nvfp4_mma, MXFP4 beside), then
# its knob sweep (tune.py --mma) at $TUNE_MS (default 1) on gate/up, down and o. Writes to $OUT: mma-pytest.log,
# bench.log, kernels.summary.md, kernels.csv, kernels.provenance.md, tune-mma.log. Stage timeouts (s): PYTEST_S 90,
# BENCH_S 150, TUNE_S 60 (0: skip); BUDGET 110 stops the benchmark from starting new shapes.
# Usage: COMMIT=... bash qerl_kernels/run_device.sh mma
#
# Mode `wgmma` (issue 22, RL batch sizes; ~3-8 minutes on one GPU, nothing else runs; 179 s on an H200 in call 6): the
# wgmma kernel (qerl_kernels/fp4_wgmma.py): its offline compile check (gluon_compile --kernel wgmma, 8
# processes: every variant's registers / spills / smem, and Triton's cache filled), its GPU tests in their own
# process with a timeout (a hang, crash or CUDA fault there ends the mode: the benchmark would hang on it too), the
# benchmark of the 7B shapes at M in $MS_WGMMA (default 16 64 128 256 512) with only its correctness checks (bf16
# cuBLAS, the default nvfp4 path, nvfp4_gluon at M <= 64 and nvfp4_wgmma timed in the same run; no MXFP4, NF4,
# backward or forced paths), then its knob sweep (tune.py --wgmma) at M = 64 and 256 on the gate/up group. Writes to
# $OUT: wgmma-compile.log, wgmma-pytest.log, bench.log, kernels.summary.md, kernels.csv, kernels.provenance.md,
# tune-wgmma.log. Stage timeouts (s), 540 in all: COMPILE_S 60, PYTEST_S 210, PREWARM_S 40 (the Triton kernels'
# variants, for the default path beside it), BENCH_S 170, TUNE_S 60 (0: skip); BUDGET 120 stops the benchmark from
# starting new shapes.
# Usage: COMMIT=$(git rev-parse HEAD) bash qerl_kernels/run_device.sh wgmma
#
# Mode `wgmma_t` (issue 22, the backward grad_y @ W; ~6-9 minutes on one H100, nothing else runs): the backward wgmma
# kernel (qerl_kernels/fp4_wgmma_t.py): its offline compile check (gluon_compile --kernel wgmma_t, 8 processes), its
# GPU tests in their own process with a timeout (a hang, crash or CUDA fault there ends the mode), the benchmark of
# the 7B shapes at M in $MS_WGMMA_T (default 16 64 128 256 512): cuBLAS bf16 and the default nvfp4 path forward,
# bf16_bwd, the default backward path (which times the new kernel among its candidates above M = 64), the forced
# transposed kernel and dequantize + cuBLAS, and nvfp4_bwd_wgmma, no correctness checks (the tests are those); then
# the kernel's knob sweep (tune.py --wgmma-t) on the 7B gate and down weights at $TUNE_MS (default 64 256 512).
# Triton's cache in /tmp (TRITON_CACHE_DIR), so a next call on the warm machine reuses the builds. Writes to $OUT:
# wgmma_t-compile.log, wgmma_t-pytest.log, bench.log, kernels.summary.md, kernels.csv, kernels.provenance.md,
# tune-wgmma_t.log, and with NCU=1 ncu-wgmma_t.log (Nsight Compute of the kernel on the 7B gate weight at $NCU_MS,
# default 256 64). Stage timeouts (s): COMPILE_S 70, PYTEST_S 200, BENCH_S 170, TUNE_S 90 (0: skip), NCU_S 60 per M;
# BUDGET 120.
# Usage: COMMIT=$(git rev-parse HEAD) bash qerl_kernels/run_device.sh wgmma_t
#
# Mode `rollout` (issue 22: the wgmma kernel in the default dispatch, ~8 minutes on one H100; carry .wb/ for
# jsonschema, which `qerl profile` needs to read config/paper.yaml): the dispatch's GPU test (every forced path with
# LoRA and residual against the reference, the chosen path inside a CUDA graph), the decode engine's and QuantLinear's
# tests (4 xdist workers), then the 7B rollout at the batches
# in $BATCHES (default 256 128) for QeRL with the wgmma kernel out of the dispatch (QERL_FP4_WGMMA=0) and in it, and
# for BF16 LoRA, side by side (one batch for the three before the next batch, so a call cut short still compares).
# Writes to $OUT: dispatch-pytest.log, rollout.tgz (the `qerl profile` folders, one per method, switch and batch,
# each with rollout.csv and dispatch.json: the kernel path the dispatch chose per shape and M bucket), rollout.log.
# Usage: COMMIT=$(git rev-parse HEAD) bash qerl_kernels/run_device.sh rollout
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/kernels-out}
W=${W:-/tmp/kernels-work}
MS=${MS:-1 4 8 16 64 128 256}
mkdir -p "$OUT" "$W"
T0=$(date +%s)
stamp() { echo "[run_device +$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/bench.log"; }
# faulted RC LOG: the tests in LOG hung (RC 124 or more: timeout) or crashed the GPU context (a fault the later
# stages would meet too); a wrong result or a compile error is not a fault
faulted() {
  [ "$1" -ge 124 ] || grep -qiE "illegal (memory|instruction)|unspecified launch failure|CUDA error|misaligned" "$2"
}
# compile_check MODE KERNEL SECONDS: the offline build of every variant of KERNEL (gluon_compile, 8 processes: the
# registers / spills / smem of each, and Triton's cache filled), its failures and verdict shown, its log in $OUT
compile_check() {
  stamp "$1: compile check"
  timeout "$3" python3 -m qerl_kernels.gluon_compile --kernel "$2" --jobs 8 > "$W/$1-compile.log" 2>&1
  local rc=$?
  grep -vE "^(\||$)|: ok " "$W/$1-compile.log" | grep -v "nanobind\|leaked" | tail -12
  stamp "$1: compile check rc=$rc"; cp "$W/$1-compile.log" "$OUT/"
}
# gpu_tests MODE SECONDS LINES PYTEST-ARGS...: the mode's GPU tests in their own process with a timeout, the last
# LINES of the log shown and the log in $OUT; a hang, crash or CUDA fault there (`faulted`) ends the call
gpu_tests() {
  local mode=$1 t=$2 n=$3; shift 3
  stamp "$mode: GPU tests"
  timeout -k 10 "$t" python3 -m pytest "$@" -rfE -p no:cacheprovider > "$W/$mode-pytest.log" 2>&1
  local rc=$?
  stamp "$mode: GPU tests rc=$rc"; tail -"$n" "$W/$mode-pytest.log"; cp "$W/$mode-pytest.log" "$OUT/"
  if faulted $rc "$W/$mode-pytest.log"; then
    stamp "$mode: hang, crash or CUDA fault in the tests: benchmark and sweep not run"; cp "$W/bench.log" "$OUT/"
    exit 1
  fi
}
# bench TIMEOUT BUDGET ARGS...: the kernel benchmark with ARGS, its own command line recorded in its provenance,
# its output appended to bench.log and passed on (each mode filters what it shows)
bench() {
  local t=$1 budget=$2; shift 2
  timeout "$t" python3 -m qerl_kernels.bench "$@" --budget-s "$budget" --out "$W" --commit "${COMMIT:-unknown}" \
    --command "python -m qerl_kernels.bench $* --budget-s $budget" 2>&1 | tee -a "$W/bench.log"
}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv \
  | tee -a "$W/bench.log"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$W/bench.log"
if [ "${1:-}" = wgmma ]; then
  MS=${MS_WGMMA:-16 64 128 256 512}
  compile_check wgmma wgmma "${COMPILE_S:-60}"
  # -v: each test id is written (unbuffered) before it runs, so a hang names its case in the log
  gpu_tests wgmma "${PYTEST_S:-210}" 25 tests/qerl_kernels/test_kernels_wgmma.py -v
  stamp "wgmma: prewarm"
  timeout "${PREWARM_S:-40}" python3 -m qerl_kernels.bench --prewarm "${PREWARM:-15}" --prewarm-only 2>&1 | tail -3 \
    | tee -a "$W/bench.log"
  stamp "wgmma: benchmark"
  SKIP="mxfp4 nf4 bf16_bwd nvfp4_bwd nvfp4_tc nvfp4_bwd_tc nvfp4_fused nvfp4_deq_cublas nvfp4_bwd_fused"
  SKIP="$SKIP nvfp4_bwd_deq_cublas nvfp4_gemv mxfp4_gemv"
  bench "${BENCH_S:-170}" "${BUDGET:-120}" --models 7B --m $MS --wgmma-checks-only --skip $SKIP \
    | grep -v "^N=" | tail -70
  stamp "wgmma: benchmark rc=$?"
  cp "$W/kernels.summary.md" "$W/kernels.csv" "$W/kernels.provenance.md" "$W/bench.log" "$OUT/" 2>/dev/null
  if [ "${TUNE_S:-60}" -gt 0 ]; then
    stamp "wgmma: knob sweep"
    timeout "${TUNE_S:-60}" python3 -m qerl_kernels.tune --wgmma --shapes ${TUNE_SHAPES:-37888x3584} --m ${TUNE_MS:-64 256} \
      > "$W/tune-wgmma.log" 2>&1
    grep "wgmma best" "$W/tune-wgmma.log"
    cp "$W/tune-wgmma.log" "$OUT/"
  fi
  stamp "wgmma: done"
  cp "$W/bench.log" "$OUT/"
  exit 0
fi
if [ "${1:-}" = wgmma_t ]; then
  export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
  MS=${MS_WGMMA_T:-16 64 128 256 512}
  compile_check wgmma_t wgmma_t "${COMPILE_S:-70}"
  gpu_tests wgmma_t "${PYTEST_S:-200}" 25 tests/qerl_kernels/test_kernels_wgmma_t.py -v
  stamp "wgmma_t: benchmark"
  SKIP="mxfp4 nf4 nvfp4_gluon nvfp4_gemv mxfp4_gemv nvfp4_mma mxfp4_mma nvfp4_wgmma nvfp4_tc nvfp4_fused"
  SKIP="$SKIP nvfp4_deq_cublas nvfp4_bwd_tc"
  bench "${BENCH_S:-170}" "${BUDGET:-120}" --models 7B --m $MS --no-check --skip $SKIP | grep -v "^N=" | tail -40
  stamp "wgmma_t: benchmark rc=$?"
  cp "$W/kernels.summary.md" "$W/kernels.csv" "$W/kernels.provenance.md" "$W/bench.log" "$OUT/" 2>/dev/null
  if [ "${TUNE_S:-90}" -gt 0 ]; then
    stamp "wgmma_t: knob sweep"
    timeout "${TUNE_S:-90}" python3 -m qerl_kernels.tune --wgmma-t --shapes ${TUNE_SHAPES:-18944x3584 3584x18944} \
      --m ${TUNE_MS:-64 256 512} > "$W/tune-wgmma_t.log" 2>&1
    grep "wgmma_t best" "$W/tune-wgmma_t.log"
    cp "$W/tune-wgmma_t.log" "$OUT/"
  fi
  if [ -n "$NCU" ] && command -v ncu >/dev/null; then
    for m in ${NCU_MS:-256 64}; do
      stamp "wgmma_t: ncu, 7B gate weight, M = $m (the sweep's first knobs: the defaults)"
      timeout "${NCU_S:-60}" ncu --clock-control none --kernel-name regex:_fp4_gemm_t_wgmma --launch-skip 2 \
        --launch-count 1 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section SchedulerStats --section Occupancy \
        python3 -m qerl_kernels.tune --wgmma-t --shapes 18944x3584 --m "$m" >> "$W/ncu-wgmma_t.log" 2>&1
    done
    grep -E "Duration|Throughput|Pipe|Stall|Issued|Eligible|Bank|Warp Cycles" "$W/ncu-wgmma_t.log" | head -60
    cp "$W/ncu-wgmma_t.log" "$OUT/"
  fi
  stamp "wgmma_t: done"
  cp "$W/bench.log" "$OUT/"
  exit 0
fi
if [ "${1:-}" = rollout ]; then
  if ls .wb/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wb/*.whl \
      && export PYTHONPATH=$PWD:/tmp/site
  fi
  stamp "rollout: dispatch and engine GPU tests"
  timeout "${PYTEST_S:-150}" python3 -m pytest tests/qerl_kernels/test_kernels_wgmma.py -k "dispatch or engine or quant_linear" \
    tests/rl/test_engine.py tests/layers/test_quant_linear.py -n 4 -q -rfE -p no:cacheprovider \
    > "$W/dispatch-pytest.log" 2>&1
  stamp "rollout: GPU tests rc=$?"; tail -5 "$W/dispatch-pytest.log"; cp "$W/dispatch-pytest.log" "$OUT/"
  for b in ${BATCHES:-256 128}; do
    for run in qerl:0 qerl:1 lora:1; do
      method=${run%%:*}; on=${run##*:}; dir=$W/prof_${method}_wgmma${on}_b$b
      stamp "rollout: $method batch $b QERL_FP4_WGMMA=$on"
      QERL_FP4_WGMMA=$on timeout "${PROFILE_S:-200}" python3 -m qerl.cli profile --archs 7B --methods "$method" \
        --ranks 32 --batches "$b" --full-batches --e2e-batches --prompt 256 --completion 2048 --out "$dir" \
        2>&1 | grep -vi warn | tail -4 | tee -a "$W/rollout.log"
      tail -1 "$dir/rollout.csv" | tee -a "$W/rollout.log"
      tar czf "$OUT/rollout.tgz" -C "$W" $(cd "$W" && ls -d prof_* 2>/dev/null)
    done
  done
  stamp "rollout: done"; cp "$W/rollout.log" "$W/bench.log" "$OUT/" 2>/dev/null
  exit 0
fi
if [ "${1:-}" = mma ]; then
  MS=${MS_MMA:-1 8}
  gpu_tests mma "${PYTEST_S:-90}" 8 tests/qerl_kernels/test_fp4_mma.py -q
  stamp "mma: benchmark"
  SKIP="nvfp4_gluon nvfp4_wgmma nf4 bf16_bwd nvfp4_bwd"
  bench "${BENCH_S:-150}" "${BUDGET:-110}" --models 7B --m $MS --gemv-checks-only --skip $SKIP \
    | grep -v "^N=" | tail -70
  stamp "mma: benchmark rc=$?"
  cp "$W/kernels.summary.md" "$W/kernels.csv" "$W/kernels.provenance.md" "$W/bench.log" "$OUT/" 2>/dev/null
  if [ "${TUNE_S:-60}" -gt 0 ]; then
    stamp "mma: knob sweep"
    timeout "${TUNE_S:-60}" python3 -m qerl_kernels.tune --mma \
      --shapes ${TUNE_SHAPES:-37888x3584 3584x18944 3584x3584} --m ${TUNE_MS:-1} > "$W/tune-mma.log" 2>&1
    grep -E "mma best|heuristic" "$W/tune-mma.log"
    cp "$W/tune-mma.log" "$OUT/"
  fi
  stamp "mma: done"
  cp "$W/bench.log" "$OUT/"
  exit 0
fi
if [ "${1:-}" = gemv ]; then
  MS=${MS_GEMV:-1 4 8 16}
  stamp "gemv: GPU tests"
  timeout "${PYTEST_S:-90}" python3 -m pytest tests/qerl_kernels/test_fp4_gemv.py -q -rfE -p no:cacheprovider \
    > "$W/gemv-pytest.log" 2>&1
  stamp "gemv: GPU tests rc=$?"; tail -8 "$W/gemv-pytest.log"; cp "$W/gemv-pytest.log" "$OUT/"
  stamp "gemv: benchmark"
  SKIP="nvfp4_gluon nvfp4_wgmma nf4 bf16_bwd nvfp4_bwd"
  bench "${BENCH_S:-150}" "${BUDGET:-110}" --models 7B --m $MS --gemv-checks-only --skip $SKIP \
    | grep -v "^N=" | tail -70
  stamp "gemv: benchmark rc=$?"
  cp "$W/kernels.summary.md" "$W/kernels.csv" "$W/kernels.provenance.md" "$W/gemv-wins.txt" "$W/bench.log" "$OUT/" \
    2>/dev/null
  stamp "gemv: knob sweep"
  timeout "${TUNE_S:-75}" python3 -m qerl_kernels.tune --gemv --shapes 18944x3584 3584x18944 --m 1 16 \
    > "$W/tune-gemv.log" 2>&1
  grep -E "gemv best|heuristic" "$W/tune-gemv.log"
  cp "$W/tune-gemv.log" "$OUT/"
  stamp "gemv: done"
  cp "$W/bench.log" "$OUT/"
  exit 0
fi
stamp "gluon compile check"
timeout "${COMPILE_S:-40}" python3 -m qerl_kernels.gluon_compile --kernel gluon > "$W/gluon-compile.log" 2>&1
rc=$?
grep -vE "^(\||$)|: ok " "$W/gluon-compile.log" | tail -12   # failures and the verdict, not the table
stamp "gluon compile check rc=$rc"
cp "$W/gluon-compile.log" "$OUT/gluon-smoke.log"
stamp prewarm
timeout "${PREWARM_S:-40}" python3 -m qerl_kernels.bench --prewarm "${PREWARM:-15}" --prewarm-only 2>&1 | tail -5 | tee -a "$W/bench.log"
stamp "gluon smoke test"
SKIP=""
timeout "${SMOKE_S:-75}" python3 -m pytest tests/qerl_kernels/test_kernels_gluon.py -q -rfE -p no:cacheprovider \
  > "$W/gluon-smoke.log" 2>&1
rc=$?
tail -25 "$W/gluon-smoke.log"; cat "$W/gluon-compile.log" "$W/gluon-smoke.log" > "$OUT/gluon-smoke.log"
# a hang, a crash or a CUDA fault drops the Gluon kernel from the rest (it would take the benchmark down with it);
# a wrong result or a compile error does not (the benchmark's checks report it, its timings still say something)
if faulted $rc "$W/gluon-smoke.log"; then
  SKIP="nvfp4_gluon"; stamp "gluon smoke rc=$rc (hang, crash or CUDA fault): nvfp4_gluon left out of the rest"
else
  stamp "gluon smoke rc=$rc"
fi
stamp benchmark
BSKIP="nvfp4_wgmma${SKIP:+ $SKIP}"   # the wgmma kernel is timed in its own mode (run_device.sh wgmma)
bench "${BENCH_S:-200}" "${BUDGET:-120}" --models ${MODELS:-7B} --m $MS --skip $BSKIP | grep -v "^check\|^N=" | tail -60
cp "$W/kernels.summary.md" "$W/bench.log" "$OUT/" 2>/dev/null
if [ -n "$NCU" ] && command -v ncu >/dev/null && [ -z "$SKIP" ]; then
  stamp ncu
  timeout "${NCU_S:-45}" ncu --clock-control none --profile-from-start off --kernel-name regex:"_fp4_gemm" \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section LaunchStats \
    --section Occupancy --metrics dram__bytes_read.sum \
    python3 -m qerl_kernels.tune --shapes 37888x3584 --m 1 16 --profile --gluon > "$W/ncu.log" 2>&1
  grep -E "_fp4_gemm|Duration|DRAM Throughput|dram__|Compute \(SM\)|Issued Warp|Registers Per|Achieved Active" \
    "$W/ncu.log" | head -60
  cp "$W/ncu.log" "$OUT/"
fi
if [ -z "$SKIP" ] && [ "${TUNE_S:-60}" -gt 0 ]; then
  stamp "Gluon config sweep"
  timeout "${TUNE_S:-60}" python3 -m qerl_kernels.tune --gluon --shapes 37888x3584 3584x18944 --m 1 16 \
    > "$W/tune-gluon.log" 2>&1
  grep "gluon best" "$W/tune-gluon.log"
  cp "$W/tune-gluon.log" "$OUT/"
fi
stamp "kernel tests (the Gluon file ran above)"
timeout "${PYTEST_S:-45}" python3 -m pytest tests/qerl_kernels -q -rfE -p no:cacheprovider \
  --ignore=tests/qerl_kernels/test_kernels_gluon.py --ignore=tests/qerl_kernels/test_kernels_wgmma.py \
  ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee "$W/pytest.log" | tail -15
cp "$W/pytest.log" "$OUT/"
stamp done
cp "$W/bench.log" "$OUT/"
tar czf "$OUT/kernels.tgz" -C "$W" .
