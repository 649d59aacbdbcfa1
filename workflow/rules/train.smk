# RL training: one job per run, R/runs/<task>/<model>/<method>/<variant>/seed<k>/ (metrics.jsonl, adapter/ or
# model/, eval.json, run.json, rollouts/ with the kept rollout samples). The tiny scale evaluates inside the training job (no second process start).
# resources.train.gpus = 0 runs `qerl train` on the CPU; N >= 1 claims N free GPUs for the job and launches N
# data-parallel ranks with torchrun (qerl/rl/distributed.py); SLURM gets gpu/mem_mb/runtime as sbatch options.
# Reruns: checkpoint.pt and rollouts/ are deliberately not outputs (qerl/rl/rollout_log.py says why). Snakemake deletes the outputs of a failed or incomplete job
# (metrics.jsonl included) before it reruns it (--rerun-incomplete, the profiles' retries); the checkpoint survives,
# and it carries the metrics history, so the resumed job writes the same metrics.jsonl as an uninterrupted one. A
# job rerun because its config section or an input changed finds a checkpoint written for other settings or input
# files, which the trainer ignores: that run starts from step 0 (qerl/rl/resume.py).
from qerl.contract.methods import TRAINED_METHODS


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
        cfg=section("train", "prompt", "evaluate", "model"),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
        data=lambda wildcards, input: f"--data {os.path.dirname(input.data)}" if input.data.endswith("rl.jsonl") else "",
        quantized=lambda wildcards, input: f"--quantized {input.quantized}" if "quantized" in input.keys() else "",
        launch=train_launcher(config["resources"]["train"]["gpus"]),
        device="--device cpu" if config["resources"]["train"]["gpus"] == 0 else "",
    conda:
        CONDA_ENV
    threads: config["train"]["threads"]
    resources:
        gpu=config["resources"]["train"]["gpus"],
        mem_mb=config["resources"]["train"]["mem_mb"],
        runtime=config["resources"]["train"]["runtime"],
    log:
        paths.train_log(R, "{task}", "{model}", "{method}", "{variant}", "{seed}"),
    benchmark:
        f"{R}/benchmarks/train/{{task}}/{{model}}/{{method}}/{{variant}}/seed{{seed}}.tsv"
    shell:
        "{params.launch} train --config {input.config} --task {wildcards.task} --method {wildcards.method}"
        " --variant {wildcards.variant} --seed {wildcards.seed} --base {input.base} {params.data} {params.quantized}"
        " --out {params.out} {params.device} 2> {log}"
