# Evaluation of the untrained rows of Tables 1/2: the base model in each weight format (bf16, nf4, mxfp4, nvfp4) on
# every benchmark of `evaluate.benchmarks`, for every seed. Trained methods are evaluated inside their training job
# (qerl.evaluate.run.evaluate_model). One results JSON per (model, method, benchmark, seed), per-sample logs
# included: R/evals/<model>/<method>/<benchmark>/seed<k>.json. With resources.train.group_runs one job writes every
# seed's file of a (model, method, benchmark): the model is built once and sampled once per seed (each seed's file is
# what a job of its own writes), so the process start-up and the model build are paid once, not once per seed;
# otherwise one job per file (the `{seed}` wildcard).
# EVALUATE_TARGETS lists every file the config asks for (`rule all` takes it through final_targets()).
# A 4-bit method reads the quantization stage's checkpoint R/quantized/<model>/<fmt>/ (AWQ-calibrated NVFP4/MXFP4,
# the NF4 recipe) when quantize.formats lists its format; otherwise it is quantized round-to-nearest at load time.
# Either way the results JSON says which (model.quantization).

# qerl.config checks that data.benchmarks provides every real benchmark of evaluate.benchmarks.
EVALUATE_SEEDS = config["seeds"] if GROUP_RUNS else ["{seed}"]  # the seeds of one job
EVALUATE_TARGETS = expand(
    paths.eval_file(R, MODEL, "{method}", "{benchmark}", "{seed}"),
    method=config["evaluate"]["methods"],
    benchmark=config["evaluate"]["benchmarks"],
    seed=config["seeds"],
)


rule evaluate:
    input:
        config=ancient(CONFIGFILE),
        base=paths.base_model_dir(R, "{model}"),
        # the generated held-out split for `tiny`; the checked benchmark files (the data manifest) otherwise
        data=lambda wildcards: (
            rules.gen_tiny.output.test
            if wildcards.benchmark == "tiny"
            else rules.data.output[0]
        ),
        quantized=lambda wildcards: (
            paths.quantized_dir(R, wildcards.model, wildcards.method)
            if wildcards.method in config["quantize"]["formats"]
            else []
        ),
    output:
        [paths.eval_file(R, "{model}", "{method}", "{benchmark}", seed) for seed in EVALUATE_SEEDS],
    wildcard_constraints:
        method="bf16|nf4|mxfp4|nvfp4",
        benchmark="gsm8k|math500|aime24|aime25|amc23|tiny",
        seed=r"\d+",
    params:
        cfg=section("evaluate", "prompt", "model", "data"),
        data=lambda wildcards, input: (
            f"--tiny-test {input.data}" if wildcards.benchmark == "tiny" else ""
        ),
        # with GPUs for training (resources.train.gpus > 0) each evaluation claims one free GPU, as training jobs do
        launch=gpu_launcher(config["resources"]["train"]["gpus"]),
        device="--device cuda" if config["resources"]["train"]["gpus"] else "--device cpu",
        quantized=lambda wildcards, input: (
            f"--quantized {input.quantized}" if input.quantized else ""
        ),
        seeds=lambda wildcards: " ".join(map(str, config["seeds"])) if GROUP_RUNS else wildcards.seed,
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=1 if config["resources"]["train"]["gpus"] else 0,
    log:
        f"{R}/logs/evaluate/{{model}}/{{method}}/{{benchmark}}/{seeds_name(EVALUATE_SEEDS)}.log",
    benchmark:
        f"{R}/benchmarks/evaluate/{{model}}/{{method}}/{{benchmark}}/{seeds_name(EVALUATE_SEEDS)}.tsv"
    shell:
        "{params.launch} evaluate --config {input.config} --base {input.base} --format {wildcards.method}"
        " --method {wildcards.method} --benchmarks {wildcards.benchmark} --seed {params.seeds}"
        " {params.data} {params.quantized} {params.device} --threads {threads} --out {output} 2> {log}"
