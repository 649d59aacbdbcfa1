# Base models: the tiny scale pretrains its own Qwen2; the other scales convert or fetch theirs.


rule pretrain_tiny:
    input:
        config=ancient(CONFIGFILE),
        pretrain=rules.gen_tiny.output.pretrain,
        test=rules.gen_tiny.output.test,
    output:
        directory(paths.base_model_dir(R, "tiny")),
    params:
        cfg=section("data", "tiny_model", "prompt"),
        data=lambda wildcards, input: os.path.dirname(input.pretrain),
    conda:
        CONDA_ENV
    threads: config["tiny_model"]["pretrain"]["threads"]
    log:
        f"{R}/logs/pretrain_tiny.log",
    benchmark:
        f"{R}/benchmarks/pretrain_tiny.tsv"
    shell:
        "qerl pretrain-tiny --config {input.config} --data {params.data} --out {output} --threads {threads} 2> {log}"
