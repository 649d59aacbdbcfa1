# QeRL reproduction harness -- the whole DAG.
#
#   snakemake --cores all                             # the tiny scale (config/config.yaml), CPU, minutes
#   snakemake --cores all --configfile config/small.yaml
#   snakemake --cores all results/tiny/models/tiny/base   # any single output, by its path
#
# Path grammar (R = <results_dir>/<scale>; the code is qerl/contract/paths.py, which the trainer, the evaluator and
# the report use too):
#   R/data/tiny/{pretrain,rl,test}.jsonl             generated arithmetic problems (tiny scale)
#   R/data/manifest.json                             real benchmark files checked/downloaded (rule data)
#   R/models/<model>/base/                           the base checkpoint (pretrain_tiny or prepare_model)
#   R/quantized/<model>/<format>/                    NVFP4 / MXFP4 (AWQ-calibrated) and NF4 checkpoints
#   R/runs/<task>/<model>/<method>/<variant>/seed<k>/  one training run (metrics.jsonl, adapter, eval, rollouts/)
#   R/tables/table<N>.{md,tex,csv,html}, R/figures/fig<N>.{png,pdf}
#   R/claims.md                                       the paper's headline claims checked claim by claim
#   R/claims.html                                     the same, as an HTML page (shown by the report)
#   R/samples.html                                    completions per method at the first and last kept step
#   R/config.yaml                                    the effective config every job reads (rule effective_config)
#   R/logs/<rule>/...  and  R/benchmarks/<rule>/...  per-job logs and timings
import os
import shutil
import sys

from snakemake.utils import validate

from qerl.config import validate_config

# Jobs run `qerl ...` and `python -m ...`. When no `qerl` is on PATH (`.venv/bin/snakemake` run without activating
# the environment), put this interpreter's bin folder first, the environment whose qerl was just imported; a qerl
# already on PATH (an activated environment, a wrapper) is left to win.
envvars:
    "PATH",


if shutil.which("qerl") is None:
    os.environ.update(PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))


# The tiny scale unless a config is given (`--configfile config/small.yaml`): a given config replaces the default
# rather than being merged into it, so no tiny-scale key leaks into another scale.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# qerl's own check first (the one `qerl check-config` runs): a bad config stops here with one line per problem,
# naming the key and the value seen (snakemake's validate would print the whole schema after its message); it also
# checks what the schema cannot (a task's methods within train.methods, data files present), and fills defaults.
config = validate_config(config, source=", ".join(map(str, workflow.configfiles)) or "snakemake config")
validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/config.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/quantize.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/render.smk"
include: "workflow/rules/claims.smk"
include: "workflow/rules/samples.smk"
include: "workflow/rules/profile.smk"



rule all:
    input:
        final_targets(),
    default_target: True
