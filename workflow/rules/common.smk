# Shared definitions: the validated config, the results prefix, the config file handed to every CLI call, and the
# input functions that list each stage's targets. Every path comes from the path grammar of qerl/contract/paths.py,
# the one the trainer, the evaluator and the report use; a pattern with wildcards is the same function called with
# "{wildcard}" arguments.
import json
import os

import yaml

from qerl import jobserver
from qerl.contract import grid, paths
from qerl.contract.methods import get_method
from qerl.io import write_text

# `config` was validated, and its defaults filled in, by the Snakefile (qerl.config.validate_config, the check the
# CLI runs, then snakemake's validate against the same schema).

SCALE = config["scale"]
R = paths.root_of(config)
# The effective config (config file + any `--config key=value`, defaults filled in) is R/config.yaml; every rule
# hands that file to its `qerl` subcommand, which validates it again. It is written when jobs run, never while the
# workflow is parsed (workflow/rules/config.smk). Jobs read it as ancient(CONFIGFILE), so rewriting it reruns
# nothing by itself; they depend on the config sections they read through `params: section(...)`, so editing one
# section reruns only those jobs.
CONFIGFILE = paths.config_file(R)


class _PlainDumper(yaml.SafeDumper):
    """No &id001 anchors in the effective config when two sections share one list object."""

    def ignore_aliases(self, data):
        return True


EFFECTIVE_CONFIG = yaml.dump(config, Dumper=_PlainDumper, sort_keys=False)
# The effective_config job (config.smk) writes it from the environment its shell command inherits: a `run:` job is
# a Snakemake process of its own (~2.5 s of imports and parsing, at the head of every fresh DAG), this is `printf`
os.environ.update(QERL_EFFECTIVE_CONFIG=EFFECTIVE_CONFIG)


def write_effective_config(path=CONFIGFILE):
    """Write the effective config to `path` atomically, unless the file already holds it."""
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != EFFECTIVE_CONFIG:
        write_text(path, EFFECTIVE_CONFIG)


_STARTED_SERVERS = []  # the socket of the job server this run started, if it started one


def start_job_server():
    """With resources.job_server: start this run's job server (qerl/jobserver.py); the jobs' `qerl` finds it
    through $QERL_JOB_SERVER, which they inherit from this process. Called by `onstart`, so a dry run starts none;
    nor does a `--touch` run (no job runs: its server's ~7 CPU-seconds of imports served nothing, twice per
    workflow/resume.sh). Without it the jobs inherit whatever $QERL_JOB_SERVER Snakemake was started with (a
    server that outlives the run, as tests/test_dag_e2e.py's)."""
    if config["resources"]["job_server"] and not workflow.touch:
        os.makedirs(f"{R}/logs", exist_ok=True)
        path = jobserver.start(os.getpid(), log=f"{R}/logs/job_server.log")
        os.environ[jobserver.ENV_VAR] = path
        _STARTED_SERVERS.append(path)


def stop_job_server():
    """Stop the job server this run started, if it started one (`onsuccess`, `onerror`); a server named by an
    inherited $QERL_JOB_SERVER is not this run's to stop."""
    while _STARTED_SERVERS:
        jobserver.stop(_STARTED_SERVERS.pop())


MODEL = config["model"]["name"]
# One software environment for every rule (pyproject.toml lists the dependencies once); `--sdm conda` builds it.
CONDA_ENV = "../../environment.yml"


def section(*keys):
    """JSON of config sections, for `params:` (a change reruns the jobs that read them)."""
    return json.dumps({k: config[k] for k in keys}, sort_keys=True)


def base_model_dir():
    return paths.base_model_dir(R, MODEL)


# ---- training runs (workflow/rules/train.smk) -------------------------------------------------------------------
def run_dir(task, method, variant, seed):
    return paths.run_dir(R, task, MODEL, method, variant, seed)


# one training run's folder, as the train rule's output pattern
RUN_PATTERN = paths.run_dir(R, "{task}", "{model}", "{method}", "{variant}", "{seed}")


def train_runs():
    """(task, method, variant, seed) of every training run: the run grid, computed once (qerl/contract/grid.py)."""
    return grid.train_runs(config)


# resources.train.jobs_per_gpu: how many GPU jobs may share one GPU (a 135M model leaves an H100 mostly idle)
SLOTS = config["resources"]["train"]["jobs_per_gpu"]


# resources.train.group_runs: one job (one process) per (task, method) trains all its runs, and one job per (model,
# format, benchmark) evaluates all the seeds; otherwise one job per run and per evaluation file.
GROUP_RUNS = config["resources"]["train"]["group_runs"]


def train_groups():
    """{(task, method): [(variant, seed), ...]} of train_runs(), in their order: the runs of one grouped training job."""
    groups = {}
    for task, method, variant, seed in train_runs():
        groups.setdefault((task, method), []).append((variant, seed))
    return groups


def seeds_name(seeds):
    """The file name part of an evaluation job's log and benchmark: seed0 for one seed, seed0-1-2 for several (and
    seed{seed}, the wildcard, for ["{seed}"])."""
    return "seed" + "-".join(map(str, seeds))


def train_launcher(gpus):
    """The command that runs `qerl <subcommand>` on `gpus` GPUs: plain on the CPU, else torchrun with one rank per
    GPU, after claiming a slot on that many GPUs for the job (qerl/rl/distributed.py; a no-op under SLURM). One GPU
    runs `qerl` itself (no torchrun: one process needs no process group)."""
    if gpus == 0:
        return "qerl"
    if gpus == 1:
        return gpu_launcher(1)
    return (f"python -m qerl.rl.distributed --gpus {gpus} --slots {SLOTS} -- "
            f"torchrun --standalone --nproc_per_node {gpus} -m qerl.cli")


def gpu_launcher(gpus):
    """`qerl` on the CPU, or on a claimed slot of one GPU (qerl/rl/distributed.py) when jobs run on GPUs."""
    if not gpus:
        return "qerl"
    return f"python -m qerl.rl.distributed --gpus 1 --slots {SLOTS} -- qerl"


def gpu_command(subcommand, on_gpu=True):
    """`qerl <subcommand>` on a claimed GPU slot with `--device cuda` where jobs run on GPUs (resources.train.gpus
    > 0) and `on_gpu` holds, else plain `qerl <subcommand>` on its default device, the CPU. Spliced into the shell
    text when the workflow is parsed, so the command of a CPU config stays what it was (nothing reruns)."""
    if on_gpu and config["resources"]["train"]["gpus"]:
        return f"{gpu_launcher(1)} {subcommand} --device cuda"
    return f"qerl {subcommand}"


def train_targets():
    return [f"{run_dir(*run)}/{paths.EVAL_FILE}" for run in train_runs()]


def train_inputs(wildcards):
    """The task's data, and for 4-bit methods the quantized checkpoint of their format (AWQ-calibrated); `wildcards`
    is anything with .task, .method and .model."""
    src = config["train"]["tasks"][wildcards.task]["source"]
    inputs = {"data": rules.gen_tiny.output.rl if src == "tiny" else rules.data.output[0]}
    fmt = get_method(wildcards.method).weights
    if fmt != "bf16":
        inputs["quantized"] = paths.quantized_dir(R, wildcards.model, fmt)
    return inputs


def final_targets():
    targets = [base_model_dir()]
    if config["data"]["benchmarks"]:
        targets.append(paths.data_manifest(R))
    return (targets + quantized_dirs(config, R, MODEL) + EVALUATE_TARGETS + train_targets() + render_targets()
            + [paths.samples_page(R)])
