# Claims: the paper's five headline claims (REPORTED.md), each checked against this scale's runs and the committed
# measurements (qerl/report/claims.py), with the numbers it rests on and a verdict per comparison:
#   snakemake --cores all claims        ->  R/claims.md   (docs/CLAIMS_TINY.md is the tiny scale's, committed)
#                                           R/claims.html (the same, as the report displays it)
# Its inputs are those of the tables and figures it draws on (qerl.report.claims.ARTIFACTS_READ).
from qerl.report.claims import claims_inputs


rule claims:
    input:
        config=ancient(CONFIGFILE),
        data=claims_inputs(config),
    output:
        md=report(paths.claims_file(R, "md"), caption="../report/claims.rst", category="Claims"),
        html=report(paths.claims_file(R, "html"), caption="../report/claims.rst", category="Claims"),
    params:
        cfg=section("scale", "model", "seeds", "train", "evaluate", "profile"),
    conda:
        CONDA_ENV
    log:
        f"{R}/logs/render/claims.log",
    benchmark:
        f"{R}/benchmarks/render/claims.tsv"
    shell:
        "qerl claims --config {input.config} --out {output.md} --html {output.html} 2> {log}"
