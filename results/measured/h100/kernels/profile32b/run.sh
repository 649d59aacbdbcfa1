#!/bin/bash
# Issue 22, calls 104-: the 32B profile on the H100 (rollouts of QeRL and BF16 LoRA first: ranks 16-64 at batch 1,
# batches 1-256 at rank 32, full-generation checks at 1 and 8; later calls: QLoRA, the GRPO steps and memory),
# each call resuming the last one's CSVs (PREV: .whl/prev). The rows go into results/measured/h100 only once the
# model's rollout, e2e and memory rows are all measured (the report reads a model's three CSVs from one folder).
# Usage (repository root, .whl/ carried): PREV=.whl/prev METHODS="lora qerl" E2E="" bash .../profile32b/run.sh
export PYTHONUNBUFFERED=1
ARCHS=32B BUDGET=${BUDGET:-520} PROF_S=${PROF_S:-570} bash qerl/profiling/run_device.sh --methods ${METHODS:-lora qerl} \
  --ranks 16 32 64 --batches 1 2 4 8 16 32 64 128 256 --full-batches 1 8 --e2e-batches $E2E
