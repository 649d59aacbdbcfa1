#!/bin/bash
# Go on with a DAG from a results folder restored WITHOUT its model weights, running only what had not finished: an
# earlier machine's `workflow/run_device.sh pack` (every small file: metrics, evaluations, tables, logs) unpacked into
# a fresh checkout, whose models/ and quantized/ folders (packed without their weights) were removed.
#   1. rebuild the models: `snakemake --until quantize` runs the model-building rules (base model, SFT, calibration,
#      quantization) that the DAG (or TARGETS) needs, and nothing downstream;
#   2. `snakemake --touch`: every output that exists is marked up to date, in the DAG's order, so the restored
#      results are newer than the rebuilt models; a job with an output missing (an unfinished training group, an
#      evaluation that had not run) is left alone;
#   3. the rest, one job per unfinished run and per missing evaluation (resources.train.group_runs off for this call):
#      a grouped job (the runs of a task and method, the seeds of an evaluation) whose runs had finished in part
#      would otherwise train all its runs again, since Snakemake removes a job's existing outputs before it runs it
#      (run 9 on the H100 trained 4 groups' finished runs again: results/measured/h100/small/dag9/PROVENANCE.md).
#      Only missing or older outputs trigger a job here (`--rerun-triggers mtime`): step 2 recorded the grouped
#      jobs' parameters and code, which the one-run jobs do not share;
#   4. `snakemake --touch` with the config as given records the grouped jobs again (nothing runs), so that a later
#      ordinary `snakemake --configfile CONFIG` finds every finished output current.
# Without step 2 every finished job behind a rebuilt model would run again ("input files updated by another job").
# The rebuilt models are the same rules on the same inputs and seeds, but not necessarily bit for bit the earlier
# machine's (GPU kernels are not bitwise deterministic): runs finished before and after a resume start from
# statistically, not bitwise, identical models.
# Usage: bash workflow/resume.sh CONFIG [TARGETS...] (extra Snakemake options in SMK_ARGS, e.g. --scheduler greedy
# --resources gpu=6; they apply to steps 1 and 3)
set -eo pipefail
config=$1; shift
snakemake "$@" --until quantize --cores all --configfile "$config" $SMK_ARGS
snakemake "$@" --touch --cores 1 --configfile "$config"
ungrouped=$(mktemp --suffix .yaml)
trap 'rm -f "$ungrouped"' EXIT
printf 'resources:\n  train:\n    group_runs: false\n' > "$ungrouped"  # merged over CONFIG, key by key
echo "resume.sh: step 3: the unfinished runs and evaluations, one job each" >&2
status=0
snakemake "$@" --cores all --keep-going --rerun-triggers mtime --configfile "$config" "$ungrouped" $SMK_ARGS \
  || status=$?
echo "resume.sh: step 4: the grouped jobs recorded again" >&2
snakemake "$@" --touch --cores 1 --configfile "$config"
exit $status
