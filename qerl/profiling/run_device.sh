#!/bin/bash
# One call on a GPU machine (the device tool): install carried wheels (.whl/: bitsandbytes), optionally run the GPU
# tests of the engine, then `qerl profile` into $OUT/prof (rollout.csv, e2e.csv, memory.csv, rollout_hf.csv) with
# the machine's description in $OUT/prof/env.txt. Resumes from PREV (a folder of earlier CSVs) when given.
# Usage: ARCHS=7B,3B BUDGET=420 TESTS=1 PREV=results/measured/h200 bash qerl/profiling/run_device.sh [extra args]
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/profile-out}
mkdir -p "$OUT/prof"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, peft, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
  'transformers', transformers.__version__, 'peft', peft.__version__, 'triton', triton.__version__)"
  echo "commit ${COMMIT:-unknown} date $(date -u +%FT%TZ)"; } | tee "$OUT/prof/env.txt"
for f in rollout.csv e2e.csv memory.csv rollout_hf.csv; do
  [ -n "$PREV" ] && [ -f "$PREV/$f" ] && cp "$PREV/$f" "$OUT/prof/$f"
done
if [ -n "$TESTS" ]; then
  timeout 240 python3 -m pytest tests/rl/test_engine.py -q -rfE -k cuda 2>&1 | tail -8
fi
python3 -m qerl.cli profile --archs "${ARCHS:-7B}" --budget-s "${BUDGET:-420}" --out "$OUT/prof" "$@" 2>&1 \
  | tee "$OUT/prof/log.txt" | grep -v Warning | tail -80
