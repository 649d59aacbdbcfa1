#!/bin/bash
# Make a results folder restored WITHOUT its model weights current again, so that Snakemake reruns only the jobs that
# had not finished: an earlier machine's `workflow/run_device.sh pack` (every small file: metrics, evaluations, tables,
# logs) unpacked into a fresh checkout, whose models/ and quantized/ folders (packed without their weights) were
# removed.
#   1. rebuild the models: `snakemake --until quantize` runs the model-building rules (base model, SFT, calibration,
#      quantization) that the DAG (or TARGETS) needs, and nothing downstream;
#   2. `snakemake --touch`: every output that exists is marked up to date, in the DAG's order, so the restored
#      results are newer than the rebuilt models; a job with an output missing (an unfinished training group, an
#      evaluation that had not run) is left alone and runs in the next, ordinary Snakemake call.
# Without step 2 every finished job behind a rebuilt model would run again ("input files updated by another job").
# The rebuilt models are the same rules on the same inputs and seeds, but not necessarily bit for bit the earlier
# machine's (GPU kernels are not bitwise deterministic): runs finished before and after a resume start from
# statistically, not bitwise, identical models.
# Usage: bash workflow/resume.sh CONFIG [TARGETS...] (extra Snakemake options in SMK_ARGS, e.g. --scheduler greedy)
set -eo pipefail
config=$1; shift
snakemake "$@" --until quantize --cores all --configfile "$config" $SMK_ARGS
snakemake "$@" --touch --cores 1 --configfile "$config"
