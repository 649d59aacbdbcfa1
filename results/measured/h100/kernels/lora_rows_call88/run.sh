#!/bin/bash
# Issue 22, call 88: the split LoRA kernels with the multi-row norm over the row block's real rows ([rows, 8192 /
# rows] chunks) at 1-8 rows (bench_lora), each group's row limit picked from that bench (the most rows at which
# the split kernel beats the path it replaces at every row count up to it), and the 7B rollout at batch 2 / 4 / 8
# (QeRL and BF16 LoRA) with the limits at 1 and at the picked ones (QERL_LORA_SPLIT_ROWS), on one lease.
# Usage (repository root, .whl/ carried): bash results/measured/h100/kernels/lora_rows_call88/run.sh
# (As run in call 88 the pick read the JSON's top level, not its "rows", and picked nothing: both rollouts ran with
# the limits at 1; fixed here afterwards.)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TRITON_DEFAULT_FP_FUSION=1
OUT=${OUT:-/tmp/lora88-out}
mkdir -p "$OUT"
timeout 110 python3 -m pytest -q -n 4 -p no:cacheprovider tests/qerl_kernels/test_decode.py \
  tests/rl/test_engine.py -k "lora or decode_kernels_match" > "$OUT/pytest.log" 2>&1; tail -2 "$OUT/pytest.log"
timeout 80 python3 -m qerl_kernels.bench_lora --models 7B --rows 1 2 4 8 --splits --out "$OUT/lora.json" \
  --md "$OUT/lora.md" > "$OUT/lora.log" 2>&1; cat "$OUT/lora.md"
PICK=$(python3 - "$OUT/lora.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
us = {(r["op"], r["rows"], r["variant"]): r["us"] for r in rows}
ops = {"q/k/v": "norm + q/k/v", "o": "o", "gate/up": "norm + gate/up", "down": "silu + down"}
out = []
for group, op in ops.items():
    best = 1
    for n in (2, 4, 8):
        cell = {v: u for (o, k, v), u in us.items() if o == op and k == n}
        if "split" not in cell or min(u for v, u in cell.items() if v != "split") <= cell["split"]:
            break
        best = n
    out.append(f"{group}={best}")
print(",".join(out))
PY
)
echo "picked QERL_LORA_SPLIT_ROWS=$PICK" | tee "$OUT/pick.txt"
for tag in one picked; do
  [ $tag = picked ] && export QERL_LORA_SPLIT_ROWS=$PICK
  OUT=/tmp/lora88-prof-$tag W=/tmp/lora88-$tag PROF_S=160 BUDGET=135 bash qerl/profiling/run_device.sh --methods qerl lora --ranks 32 \
    --batches 2 4 8 --full-batches --e2e-batches > "$OUT/profile_$tag.log" 2>&1
  cp /tmp/lora88-$tag/prof/rollout.csv "$OUT/rollout_$tag.csv"
  grep -E "tokens_per_s" "$OUT/profile_$tag.log" | cut -c1-160
done
cp /tmp/lora88-one/prof/env.txt "$OUT/"
