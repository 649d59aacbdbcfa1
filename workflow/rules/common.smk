# Shared definitions: the validated config, the results prefix, the config file handed to every CLI call, and the
# input functions that list each stage's targets.
import json
import os

from qerl.config import validate_config

# The JSON schema (Snakefile: snakemake.utils.validate) catches unknown keys and types; qerl's own check adds the
# semantic ones (unknown method names, missing data files) with the same messages the CLI gives.
config = validate_config(config, source="snakemake config")

SCALE = config["scale"]
R = f"{config['results_dir']}/{SCALE}"
# Every rule hands this file to its `qerl` subcommand, which validates it again; jobs depend on the config
# section they read through `params`, so editing one section reruns only the jobs that read it.
CONFIGFILE = workflow.configfiles[-1] if workflow.configfiles else "config/config.yaml"
MODEL = config["model"]["name"]
# One software environment for every rule (pyproject.toml lists the dependencies once); `--sdm conda` builds it.
CONDA_ENV = "../../environment.yml"


def section(*keys):
    """JSON of config sections, for `params:` (a change reruns the jobs that read them)."""
    return json.dumps({k: config[k] for k in keys}, sort_keys=True)


def base_model_dir():
    return f"{R}/models/{MODEL}/base"


def final_targets():
    targets = [base_model_dir()]
    if config["data"]["benchmarks"]:
        targets.append(f"{R}/data/manifest.json")
    return targets
