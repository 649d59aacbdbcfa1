#!/bin/bash
# The small scale's stages and training step, diagnosed on a lent GPU (the device tool), in the background of
# workflow/run_device.sh (`bg diag bash qerl/profiling/train_device.sh`, followed with `follow diag SECONDS`).
# In order, each step's output appended to $W/diag.log and its files under $W (packed by `pack`):
#   1. the DAG's own first stages (prepare_model, sft, calibrate + quantize NVFP4), their job seconds;
#   2. the start-up of one job (imports, CUDA context);
#   3. qerl.profiling.train_trace: 4 steps of BF16 LoRA and QeRL on the real task, the last one profiled phase by
#      phase, QeRL's non-finite values traced (--check-finite); then full fine-tuning (TF32 off and on), QLoRA and
#      MXFP4 LoRA (2 steps), and BF16 LoRA / QeRL without gradient checkpointing;
#   4. 1 and 3 BF16 LoRA trainers side by side on the one GPU (aggregate steps/s);
#   5. the untrained GSM8K evaluation (1319 problems) at the config's batch and at 512 rows;
#   6. the SFT loop in float32 and in bfloat16 autocast, 40 steps each.
# Usage (from $SRC, the installed environment): COMMIT=... bash qerl/profiling/train_device.sh
set -o pipefail
W=${W:-/tmp/qerl-diag}
CFG=${CFG:-config/small.yaml}
R=results/small
M=smollm2-135m
mkdir -p "$W"
T0=$(date +%s)
log() { echo "[diag +$(( $(date +%s) - T0 ))s] $*" | tee -a "$W/diag.log"; }
run() { local name=$1; shift; log "start $name: $*"; local t=$(date +%s)
        timeout "${STEP_S:-300}" "$@" > "$W/$name.log" 2>&1; local rc=$?
        log "end $name rc=$rc $(( $(date +%s) - t ))s"; grep -vE "Warn|warn|^\s*$" "$W/$name.log" | tail -${TAILN:-6} | tee -a "$W/diag.log"; }
log "commit ${COMMIT:-unknown} $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"

run prep snakemake "$R/quantized/$M/nvfp4" --cores all --configfile "$CFG" --scheduler greedy --resources gpu=8
for f in "$R"/benchmarks/*.tsv "$R"/benchmarks/*/*.tsv "$R"/benchmarks/*/*/*.tsv; do
  [ -f "$f" ] && echo "$f $(tail -1 "$f" | cut -f1)" | tee -a "$W/diag.log"; done
cp "$R"/models/$M/base/sft_info.json "$W/" 2>/dev/null

run startup bash -c "time python3 -c 'import torch, transformers, peft, lm_eval, qerl.cli, qerl.rl.trainer, \
qerl.evaluate.run; torch.zeros(1, device=\"cuda\"); print(\"ok\")'"

TT="python3 -m qerl.profiling.train_trace --config $CFG --task gsm8k --base $R/models/$M/base --quantized-root $R/quantized/$M"
TAILN=14 run trace_main $TT --methods lora qerl --steps 4 --check-finite --out "$W/trace_main.json" --md "$W/trace_main.md"
TAILN=10 run trace_full $TT --methods full --steps 2 --tf32 off --out "$W/trace_full_fp32.json" --md "$W/trace_full_fp32.md"
TAILN=10 run trace_full_tf32 $TT --methods full --steps 2 --tf32 on --out "$W/trace_full_tf32.json" --md "$W/trace_full_tf32.md"
TAILN=12 run trace_other $TT --methods qlora mxfp4_lora --steps 2 --out "$W/trace_other.json" --md "$W/trace_other.md"
TAILN=12 run trace_nogc $TT --methods lora qerl --steps 2 --gc off --out "$W/trace_nogc.json" --md "$W/trace_nogc.md"

log "concurrency: 3 BF16 LoRA trainers at once, 4 steps each, no profiler"
t=$(date +%s)
for i in 1 2 3; do $TT --methods lora --steps 4 --no-profile > "$W/conc$i.log" 2>&1 & done
wait
log "3 at once: $(( $(date +%s) - t ))s wall"; grep -h '"step"' "$W"/conc*.log | tee -a "$W/diag.log"

for b in 128 512; do
  sed "s/^  batch_size: 128/  batch_size: $b/" "$CFG" > "$W/eval_b$b.yaml"
  run eval_b$b qerl evaluate --config "$W/eval_b$b.yaml" --base $R/models/$M/base --format bf16 --method bf16 \
    --benchmarks gsm8k --seed 0 --device cuda --out "$W/eval_b$b.json"
done

run sft_compare python3 - <<'EOF'
import time, torch
from qerl.config import load_config
from qerl.data.benchmarks import load_benchmark
from qerl.models.pretrain import encode_examples, pretrain
from qerl.models.sft import sft_rows
from qerl.policy.core import load_base
cfg = load_config("config/small.yaml"); sc = cfg["sft"]
for name, ac in (("float32", None), ("bf16-autocast", torch.bfloat16)):
    model, tok = load_base("results/small/models/smollm2-135m/pretrained", "float32", "cuda")
    ex = [e for e in encode_examples(sft_rows(load_benchmark("gsm8k", cfg["data"]["root"], split="train", limit=2000)),
                                     tok, "paper") if len(e[0]) <= sc["max_tokens"]]
    for bs in (32, 64):  # 128 rows in float32 ran out of memory (the loss over full logits)
        st = pretrain(model, ex, steps=40, time_budget_s=1e9, batch_size=bs, lr=1e-4, warmup_steps=5, weight_decay=0.0,
                      seed=0, desc="sft", autocast_dtype=ac)
        print(name, "batch", bs, "s/step", round(st["seconds"] / 40, 4), "loss", round(st["final_loss"], 4), flush=True)
EOF
log "done"
