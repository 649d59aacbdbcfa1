# Render: every paper table and figure beside the paper's numbers, one rule per artifact, named by its id, so
#   snakemake --cores all table1        snakemake --cores all fig8
# rebuild one artifact (and whatever runs it needs). The registry (qerl/report/registry.py) says what each artifact
# reads: training runs R/runs/<task>/<model>/<method>/<variant>/seed<k>/{metrics.jsonl,eval.json}, untrained
# evaluations R/evals/<model>/<method>/<benchmark>/seed<k>.json, and committed profiling files
# <results_dir>/measured/<gpu>/*.csv (only those present; absent ones render as "not measured").
# Outputs: R/tables/table<N>.{md,tex,csv}, R/figures/fig<N>.{png,pdf}; captions in workflow/report/<id>.rst.
from qerl.report.registry import ARTIFACTS, input_files, output_files


for _artifact in ARTIFACTS.values():

    rule:
        name:
            _artifact.id
        input:
            config=ancient(CONFIGFILE),
            data=input_files(_artifact, config),
        output:
            [
                report(
                    path,
                    caption=f"../report/{_artifact.id}.rst",
                    category="Tables" if _artifact.kind == "table" else "Figures",
                    subcategory=_artifact.category,
                )
                for path in output_files(_artifact, config)
            ],
        params:
            cfg=section("scale", "model", "seeds", "train", "evaluate", "profile"),
            artifact=_artifact.id,
            out=lambda wildcards, output: os.path.dirname(output[0]),
        conda:
            CONDA_ENV
        log:
            f"{R}/logs/render/{_artifact.id}.log",
        benchmark:
            f"{R}/benchmarks/render/{_artifact.id}.tsv"
        shell:
            "qerl render --config {input.config} --artifact {params.artifact} --out-dir {params.out} 2> {log}"


def render_targets():
    """Every table and figure file of the registry, and the claims, for `rule all`."""
    return [path for artifact in ARTIFACTS.values() for path in output_files(artifact, config)] + [f"{R}/claims.md"]


# The paper's headline claims, each checked against this scale's runs and measurements (qerl/report/claims.py):
#   snakemake --cores all claims        ->  R/claims.md   (docs/CLAIMS_TINY.md is the tiny scale's, committed)
from qerl.report.claims import claims_inputs


rule claims:
    input:
        config=ancient(CONFIGFILE),
        data=claims_inputs(config),
    output:
        report(f"{R}/claims.md", caption="../report/claims.rst", category="Claims"),
    params:
        cfg=section("scale", "model", "seeds", "train", "evaluate", "profile"),
    conda:
        CONDA_ENV
    log:
        f"{R}/logs/render/claims.log",
    benchmark:
        f"{R}/benchmarks/render/claims.tsv"
    shell:
        "qerl claims --config {input.config} --out {output} 2> {log}"
