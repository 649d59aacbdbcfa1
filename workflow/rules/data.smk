# Data: the tiny scale's generated problems, and the real benchmarks (checked, or downloaded when missing).


rule gen_tiny:
    input:
        config=ancient(CONFIGFILE),
    output:
        pretrain=paths.tiny_split(R, "pretrain"),
        rl=paths.tiny_split(R, "rl"),
        test=paths.tiny_split(R, "test"),
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
        paths.data_manifest(R),
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
