# RL training: one run per folder, R/runs/<task>/<model>/<method>/<variant>/seed<k>/ (metrics.jsonl, adapter/ or
# model/, eval.json, run.json, rollouts/ with the kept rollout samples); the trained policy is evaluated inside the
# training job (no second process start).
# Jobs: rule `train` trains one run (wildcards). With resources.train.group_runs (the tiny and small scales) one job
# per (task, method) trains all its runs, variants and seeds, one after the other in one process (rule
# train_<task>_<method>, its outputs every run's files): each run's files are what a job of its own writes, and the
# process start-up (~8 CPU-seconds of imports on a 2-core Xeon, against ~14 of RL and evaluation per run) is paid once
# per (task, method). Each run is still a file target: asking for one runs its group's job, whose runs trained already
# resume at their last checkpoint and are only evaluated again. Without group_runs, one job per run, e.g. to spread
# the runs over GPUs or SLURM jobs; a run the DAG needs outside train_runs() is a `train` job either way.
# resources.train.gpus = 0 runs `qerl train` on the CPU; N >= 1 claims N free GPUs for the job and launches N
# data-parallel ranks with torchrun (qerl/rl/distributed.py); SLURM gets gpu/mem_mb/runtime as sbatch options.
# Reruns: checkpoint.pt and rollouts/ are deliberately not outputs (qerl/rl/rollout_log.py says why). Snakemake deletes the outputs of a failed or incomplete job
# (metrics.jsonl included) before it reruns it (--rerun-incomplete, the profiles' retries); the checkpoint survives,
# and it carries the metrics history, so the resumed job writes the same metrics.jsonl as an uninterrupted one. A
# job rerun because its config section or an input changed finds a checkpoint written for other settings or input
# files, which the trainer ignores: that run starts from step 0 (qerl/rl/resume.py).
import re
from types import SimpleNamespace

from qerl.contract.methods import TRAINED_METHODS

# What both forms of the training job share: the command, its options and the resources of one run.
TRAIN_SHELL = (
    "{params.launch} train --config {input.config} --task {params.task} --method {params.method}"
    " --variant {params.variant} --seed {params.seeds} --base {input.base} {params.data} {params.quantized}"
    " --out {params.out} {params.device} 2> {log}"
)
TRAIN_PARAMS = {
    "cfg": section("train", "prompt", "evaluate", "model"),
    "data": lambda wildcards, input: f"--data {os.path.dirname(input.data)}" if input.data.endswith("rl.jsonl") else "",
    "quantized": lambda wildcards, input: f"--quantized {input.quantized}" if "quantized" in input.keys() else "",
    "launch": train_launcher(config["resources"]["train"]["gpus"]),
    "device": "--device cpu" if config["resources"]["train"]["gpus"] == 0 else "",
}
TRAIN_RESOURCES = {key: config["resources"]["train"][name]
                   for key, name in (("gpu", "gpus"), ("mem_mb", "mem_mb"), ("runtime", "runtime"))}


rule train:
    input:
        unpack(train_inputs),
        config=ancient(CONFIGFILE),
        base=paths.base_model_dir(R, "{model}"),
    output:
        metrics=f"{RUN_PATTERN}/{paths.METRICS_FILE}",
        eval=f"{RUN_PATTERN}/{paths.EVAL_FILE}",
    wildcard_constraints:
        method="|".join(TRAINED_METHODS),
        seed=r"\d+",
    params:
        **TRAIN_PARAMS,
        task=lambda wildcards: wildcards.task,
        method=lambda wildcards: wildcards.method,
        variant=lambda wildcards: wildcards.variant,
        seeds=lambda wildcards: wildcards.seed,
        out=lambda wildcards, output: os.path.dirname(output.metrics),
    conda:
        CONDA_ENV
    threads: config["train"]["threads"]
    resources:
        **TRAIN_RESOURCES,
    log:
        paths.train_log(R, "{task}", "{model}", "{method}", "{variant}", "{seed}"),
    benchmark:
        f"{R}/benchmarks/train/{{task}}/{{model}}/{{method}}/{{variant}}/seed{{seed}}.tsv"
    shell:
        TRAIN_SHELL


# The grouped jobs: a rule without wildcards per (task, method) of several runs, which Snakemake prefers to `train`
# for the files it lists (a rule without wildcards wins when no ruleorder says otherwise).
for (_task, _method), _runs in train_groups().items() if GROUP_RUNS else ():
    if len(_runs) < 2:
        continue
    _dirs = [paths.run_dir(R, _task, MODEL, _method, variant, seed) for variant, seed in _runs]

    rule:
        name:
            re.sub(r"\W", "_", f"train_{_task}_{_method}")
        input:
            **train_inputs(SimpleNamespace(task=_task, method=_method, model=MODEL)),
            config=ancient(CONFIGFILE),
            base=paths.base_model_dir(R, MODEL),
        output:
            [f"{run}/{name}" for run in _dirs for name in (paths.METRICS_FILE, paths.EVAL_FILE)],
        params:
            **TRAIN_PARAMS,
            task=_task,
            method=_method,
            variant=" ".join(variant for variant, _ in _runs),
            seeds=" ".join(str(seed) for _, seed in _runs),
            # from the outputs (a function): as a plain string, Snakemake's params trigger would rerun finished jobs
            out=lambda wildcards, output: " ".join(
                os.path.dirname(f) for f in output if os.path.basename(f) == paths.EVAL_FILE
            ),
        conda:
            CONDA_ENV
        threads: config["train"]["threads"]
        # the longest jobs first (most runs), so that a core is not left with one long job at the end
        priority: len(_runs)
        resources:
            **{**TRAIN_RESOURCES, "runtime": TRAIN_RESOURCES["runtime"] * len(_runs)},
        log:
            paths.train_group_log(R, _task, MODEL, _method),
        benchmark:
            f"{R}/benchmarks/train/{_task}/{MODEL}/{_method}/{paths.GROUP_RUNS_NAME}.tsv"
        shell:
            TRAIN_SHELL
