#!/bin/bash
# Run a command (e.g. the small DAG's snakemake) under CUDA's multi-process service (MPS): the jobs that share one GPU
# then run their kernels at the same time instead of taking turns (time-slicing). The small scale's jobs are bound by
# the host launching small kernels, so this is where sharing pays: on one H100 (results/measured/h100/small/
# PROVENANCE.md, run 9) 6-8 jobs under MPS took 6.6-8.8 s per GRPO step with 4 updates per rollout, against 7.8-10.6 s
# with ONE update per rollout for 6 time-sliced jobs (run 7); one job alone takes 3.2-4.3 s.
# A private daemon (pipe and log folders under /tmp/qerl-mps-$USER) is started for the command and stopped after it;
# where no daemon can start (no nvidia-cuda-mps-control, or a client cannot reach it) the command runs as it is.
#   bash workflow/with_mps.sh snakemake --cores all --resources gpu=8 --configfile config/small.yaml
# QERL_PYTHON: the Python with torch that checks a client can reach the daemon (default python3). Exit status: the
# command's.
[ $# -gt 0 ] || { echo "usage: bash workflow/with_mps.sh COMMAND [ARGS...]" >&2; exit 2; }
dir=${QERL_MPS_DIR:-/tmp/qerl-mps-${USER:-$(id -u)}}
export CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
started=0
if command -v nvidia-cuda-mps-control >/dev/null 2>&1 && mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" \
    "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d \
    && "${QERL_PYTHON:-python3}" -c "import torch; torch.ones(1, device='cuda').sum().item()" >/dev/null 2>&1; then
  started=1
  echo "with_mps.sh: MPS on (daemon in $dir)" >&2
else
  [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] && echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  echo "with_mps.sh: MPS unavailable here; the jobs time-slice the GPU" >&2
fi
"$@"
rc=$?
[ $started = 1 ] && echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
exit $rc
