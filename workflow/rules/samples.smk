# Samples: what the policies wrote at the first and the last kept step, per task and method, and each reward
# figure's runs linked to their rollout files (qerl/report/samples.py):
#   snakemake --cores all samples        ->  R/samples.html (the report's "Samples" page)
# Its inputs are the metrics.jsonl of those runs: the training job writes rollouts/ (deliberately not an output,
# qerl/rl/rollout_log.py says why) before it.
from qerl.report.samples import samples_inputs


rule samples:
    input:
        config=ancient(CONFIGFILE),
        data=samples_inputs(config),
    output:
        report(paths.samples_page(R), caption="../report/samples.rst", category="Samples"),
    params:
        cfg=section("scale", "model", "seeds", "train"),
    conda:
        CONDA_ENV
    log:
        f"{R}/logs/render/samples.log",
    benchmark:
        f"{R}/benchmarks/render/samples.tsv"
    shell:
        "qerl samples --config {input.config} --out {output} 2> {log}"
