# Render: every paper table and figure beside the paper's numbers, one rule per artifact, named by its id, so
#   snakemake --cores all table1        snakemake --cores all fig8
# rebuild one artifact (and whatever runs it needs). The registry (qerl/report/registry.py) says what each artifact
# reads: training runs R/runs/<task>/<model>/<method>/<variant>/seed<k>/{metrics.jsonl,eval.json}, untrained
# evaluations R/evals/<model>/<method>/<benchmark>/seed<k>.json, and committed profiling files
# <results_dir>/measured/<gpu>/*.csv (only those present; absent ones render as "not measured").
# Outputs: R/tables/table<N>.{md,tex,csv,html}, R/figures/fig<N>.{png,pdf}; captions in workflow/report/<id>.rst.
# In the report (`snakemake --report report.html`) a table's HTML page is displayed, its md/tex/csv are downloads.
from qerl.report.registry import ARTIFACTS, input_files, output_files

# The label of each table file in the report's list: "Table 1 ..." | "HTML, shown here" / "Markdown, download" / ...
TABLE_FILE_LABEL = {
    "html": "HTML, shown here",
    "md": "Markdown, download",
    "tex": "LaTeX, download",
    "csv": "CSV, download",
}


def report_labels(artifact, path):
    if artifact.kind != "table":
        return None
    return {"table": artifact.title, "file": TABLE_FILE_LABEL[path.rsplit(".", 1)[1]]}



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
                    labels=report_labels(_artifact, path),
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
            "qerl render --config {input.config} --artifact {params.artifact} --out {params.out} 2> {log}"


def render_targets():
    """Every table and figure file of the registry, and the claims, for `rule all`."""
    return [path for artifact in ARTIFACTS.values() for path in output_files(artifact, config)] + [
        paths.claims_file(R, "md"),
        paths.claims_file(R, "html"),
    ]

