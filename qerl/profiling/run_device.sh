#!/bin/bash
# One call on a GPU machine (the device tool): install carried wheels (.whl/: bitsandbytes for QLoRA and the 8-bit
# AdamW of the paper config; jsonschema, jsonschema-specifications, referencing, rpds-py and attrs, which `qerl profile` needs
# to read the training settings of --config, default config/paper.yaml), compile the kernels in
# parallel, optionally run the engine's GPU tests (TESTS=1) and the decode-step trace (TRACE=1: qerl.profiling.
# step_trace, the current engine against .whl/engine_before.py when present; TRACE_ALSO="QERL_FP4_MMA=0": again with
# each setting, trace_QERL_FP4_MMA0.md), the LoRA down-product benchmark
# (LORA_BENCH=1: qerl_kernels.bench_lora, rows $LORA_ROWS; again with .whl/decode_before.py's kernels when present),
# then `qerl profile` into $W/prof
# (rollout.csv, e2e.csv, memory.csv, rollout_hf.csv; the machine's description in env.txt; the log in log.txt).
# Resumes from PREV (a folder of earlier CSVs and dispatch.json, e.g. the last call's) when given. Everything is
# packed into $OUT/profile.tgz (the device tool returns at most 8 files).
# Usage: COMMIT=... ARCHS="7B 3B" BUDGET=300 TESTS=1 TRACE=1 LORA_BENCH=1 PREV=dir bash qerl/profiling/run_device.sh [qerl profile args]
# (lists are space-separated, as every qerl subcommand takes them: --batches 1 8 64)
# The profile is cut (and resumes from PREV next call) so that the archive is written inside the call's limit:
# LIMIT_S (default 600, the device tool's per-call limit) less the time already spent here less 30 s; PROF_S caps it.
set -o pipefail
START=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/profile-out}
W=${W:-/tmp/profile-work}
mkdir -p "$OUT" "$W/prof"
trap 'tar czf "$OUT/profile.tgz" -C "$W" .' EXIT  # whatever was measured comes back, however the script ends
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
python3 -c "import jsonschema, yaml" 2>/dev/null || { echo "qerl profile reads the GRPO step's settings from a validated \
config (--config) and needs jsonschema: carry its wheels in .whl/ (jsonschema, jsonschema-specifications, attrs, \
referencing, rpds-py; python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
--platform manylinux_2_17_x86_64 -d .whl NAME)" >&2; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, peft, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
  'transformers', transformers.__version__, 'peft', peft.__version__, 'triton', triton.__version__)"
  echo "commit ${COMMIT:-unknown} date $(date -u +%FT%TZ)"; } | tee "$W/prof/env.txt"
for f in rollout.csv e2e.csv memory.csv rollout_hf.csv dispatch.json; do
  [ -n "$PREV" ] && [ -f "$PREV/$f" ] && cp "$PREV/$f" "$W/prof/$f"
done
[ -n "$PREWARM" ] && python3 -m qerl_kernels.bench --prewarm "$PREWARM" --prewarm-only 2>&1 | tail -3
if [ -n "$TESTS" ]; then
  timeout "${TESTS_S:-200}" python3 -m pytest tests/rl/test_engine.py tests/qerl_kernels/test_decode.py \
    tests/qerl_kernels/test_kernels_fused.py tests/qerl_kernels/test_fp4_gemv.py -q -rfE -n "${TESTS_WORKERS:-4}" \
    -k "cuda or triton or aqn or epilogue or decode or lora or gemv" 2>&1 \
    | tee "$W/pytest-engine.log" | tail -12
fi
if [ -n "$LORA_BENCH" ]; then  # the LoRA down-products: split kernel vs norm + cuBLAS (qerl_kernels.bench_lora)
  timeout "${LORA_S:-150}" python3 -m qerl_kernels.bench_lora --rows ${LORA_ROWS:-1 8 16 64} --splits ${LORA_SPLITS:-16} \
    --out "$W/lora.json" --md "$W/lora.md" > "$W/lora.log" 2>&1; tail -3 "$W/lora.log"; cat "$W/lora.md"
  if [ -f .whl/decode_before.py ]; then  # the same with an earlier decode module's kernels (`git show REV:...`)
    timeout "${LORA_S:-150}" python3 -m qerl_kernels.bench_lora --rows ${LORA_ROWS:-1 8 16 64} --splits ${LORA_SPLITS:-16} \
      --decode-file .whl/decode_before.py --out "$W/lora_before.json" --md "$W/lora_before.md" > "$W/lora_before.log" 2>&1
    cat "$W/lora_before.md"
  fi
fi
if [ -n "$TRACE" ]; then
  EF=""; [ -f .whl/engine_before.py ] && EF="--engine-file .whl/engine_before.py --engine-name before"
  for setting in "" $TRACE_ALSO; do  # TRACE_ALSO="QERL_FP4_MMA=0 ...": the trace again with each setting
    tag=${setting:+_${setting//=/}}
    env $setting timeout "${TRACE_S:-240}" python3 -m qerl.profiling.step_trace --arch "${TRACE_ARCH:-7B}" \
      --methods lora qerl --batches ${TRACE_BATCHES:-1 64} --span 1024 $EF --out "$W/trace$tag.json" \
      --md "$W/trace$tag.md" 2>&1 | grep -v Warn | grep -E "^\| |^# " | head -30
  done
fi
LEFT=$(( ${LIMIT_S:-600} - (SECONDS - START) - 30 ))
PROF_S=${PROF_S:-420}
[ "$LEFT" -lt "$PROF_S" ] && { echo "# profile cut to ${LEFT} s (the call's limit)"; PROF_S=$LEFT; }
timeout "$PROF_S" python3 -m qerl.cli profile --archs ${ARCHS:-7B} --budget-s "${BUDGET:-300}" --out "$W/prof" "$@" 2>&1 \
  | tee "$W/prof/log.txt" | grep -v Warning | grep -E "tokens_per_s|# |budget" | cut -c1-200 | tail -60
