# RL training: one job per run, R/runs/<task>/<model>/<method>/<variant>/seed<k>/ (metrics.jsonl, adapter/ or
# model/, eval.json, run.json). The tiny scale evaluates inside the training job (no second process start).
from qerl.methods import TRAINED_METHODS


def run_dir(task, method, variant, seed):
    return f"{R}/runs/{task}/{MODEL}/{method}/{variant}/seed{seed}"


def train_runs():
    """(task, method, variant, seed) of the main runs (every task) and of the ablations (their task only)."""
    tr, ab = config["train"], config["train"]["ablations"]
    runs = [(t, m, "default", s) for t in tr["tasks"] for m in tr["methods"] for s in config["seeds"]]
    task = ab["task"] or next(iter(tr["tasks"]))
    variants = []
    if ab["method"] in tr["methods"]:
        variants += [(ab["method"], f"aqn-{k}") for k in ab["aqn_schedules"]]
        variants += [(ab["method"], "noaqn")] if ab["noaqn"] else []
        variants += [(ab["method"], f"rank{r}") for r in ab["ranks"]]
    variants += [(m, f"lr{lr:g}") for m in ab["lr_methods"] if m in tr["methods"] for lr in ab["lrs"]]
    runs += [(task, m, v, s) for m, v in variants for s in ab["seeds"]]
    return runs


def train_targets():
    return [f"{run_dir(*run)}/eval.json" for run in train_runs()]


def train_data(wildcards):
    src = config["train"]["tasks"][wildcards.task]["source"]
    return rules.gen_tiny.output.rl if src == "tiny" else rules.data.output[0]


rule train:
    input:
        config=ancient(CONFIGFILE),
        base=f"{R}/models/{{model}}/base",
        data=train_data,
    output:
        metrics=f"{R}/runs/{{task}}/{{model}}/{{method}}/{{variant}}/seed{{seed}}/metrics.jsonl",
        eval=f"{R}/runs/{{task}}/{{model}}/{{method}}/{{variant}}/seed{{seed}}/eval.json",
    wildcard_constraints:
        method="|".join(TRAINED_METHODS),
        seed=r"\d+",
    params:
        cfg=section("train", "prompt", "evaluate", "model"),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
        data=lambda wildcards, input: f"--data {os.path.dirname(input.data)}" if input.data.endswith("rl.jsonl") else "",
    conda:
        CONDA_ENV
    threads: config["train"]["threads"]
    resources:
        mem_mb=4000,
    log:
        f"{R}/logs/train/{{task}}/{{model}}/{{method}}/{{variant}}/seed{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/train/{{task}}/{{model}}/{{method}}/{{variant}}/seed{{seed}}.tsv"
    shell:
        "qerl train --config {input.config} --task {wildcards.task} --method {wildcards.method}"
        " --variant {wildcards.variant} --seed {wildcards.seed} --base {input.base} {params.data}"
        " --out {params.out} --no-progress 2> {log}"
