# Data: the tiny scale's generated problems, and the real benchmarks (checked, or downloaded when missing).


rule gen_tiny:
    input:
        config=ancient(CONFIGFILE),
    output:
        pretrain=f"{R}/data/tiny/pretrain.jsonl",
        rl=f"{R}/data/tiny/rl.jsonl",
        test=f"{R}/data/tiny/test.jsonl",
    params:
        cfg=section("data"),
        out=lambda wildcards, output: os.path.dirname(output.pretrain),
    conda:
        CONDA_ENV
    log:
        f"{R}/logs/gen_tiny.log",
    benchmark:
        f"{R}/benchmarks/gen_tiny.tsv"
    shell:
        "qerl gen-tiny --config {input.config} --out {params.out} 2> {log}"


rule data:
    input:
        config=ancient(CONFIGFILE),
    output:
        f"{R}/data/manifest.json",
    params:
        cfg=section("data"),
    conda:
        CONDA_ENV
    log:
        f"{R}/logs/data.log",
    benchmark:
        f"{R}/benchmarks/data.tsv"
    shell:
        "qerl data --config {input.config} --out {output} 2> {log}"
