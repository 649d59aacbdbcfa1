# Evaluation of the untrained rows of Tables 1/2: the base model in each weight format (bf16, nf4, mxfp4, nvfp4) on
# every benchmark of `evaluate.benchmarks`, for every seed. Trained methods are evaluated inside their training job
# (qerl.evaluate.run.evaluate_model). One job = one (model, method, benchmark, seed) results JSON, per-sample logs
# included: R/evals/<model>/<method>/<benchmark>/seed<k>.json
# EVALUATE_TARGETS lists every file the config asks for (`rule all` takes it through final_targets()).
# A 4-bit method reads the quantization stage's checkpoint R/quantized/<model>/<fmt>/ (AWQ-calibrated NVFP4/MXFP4,
# the NF4 recipe) when quantize.formats lists its format; otherwise it is quantized round-to-nearest at load time.
# Either way the results JSON says which (model.quantization).

# qerl.config checks that data.benchmarks provides every real benchmark of evaluate.benchmarks.
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
        paths.eval_file(R, "{model}", "{method}", "{benchmark}", "{seed}"),
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
    conda:
        CONDA_ENV
    threads: 1
    resources:
        gpu=1 if config["resources"]["train"]["gpus"] else 0,
    log:
        f"{R}/logs/evaluate/{{model}}/{{method}}/{{benchmark}}/seed{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/evaluate/{{model}}/{{method}}/{{benchmark}}/seed{{seed}}.tsv"
    shell:
        "{params.launch} evaluate --config {input.config} --base {input.base} --format {wildcards.method}"
        " --method {wildcards.method} --benchmarks {wildcards.benchmark} --seed {wildcards.seed}"
        " {params.data} {params.quantized} {params.device} --threads {threads} --out {output} 2> {log}"
