"""Config validation: one schema for the Snakefile and the CLI; errors name the key and the value seen."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from qerl.config import ConfigError, load_config, load_schema, validate_config
from qerl.contract.methods import METHODS, get_method


def _write(tmp_path, cfg):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_default_config_is_valid_and_filled(repo_root):
    cfg = load_config(repo_root / "config" / "config.yaml")
    assert cfg["scale"] == "tiny"
    assert cfg["tiny_model"]["pretrain"]["eval_temperature"] == 0.6
    assert cfg["quantize"]["calibration"]["n_sequences"] >= 1


def test_empty_config_gets_every_default():
    cfg = validate_config({})
    assert cfg["data"]["tiny"]["levels"] == [1, 2, 3, 4, 5]
    assert cfg["model"]["source"] == "tiny"


def _walk(node, path="<root>"):
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")


def test_every_schema_key_has_description_and_default():
    for path, node in _walk(load_schema()):
        if path == "<root>":
            continue
        assert "description" in node, f"{path} has no description"
        assert "default" in node, f"{path} has no default"


def test_unknown_key_named(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['n_trian'\] under 'data.tiny'"):
        load_config(_write(tmp_path, {"data": {"tiny": {"n_trian": 5}}}))


def test_unknown_top_level_key_named(tmp_path):
    with pytest.raises(ConfigError, match=r"\['sceal'\]"):
        load_config(_write(tmp_path, {"sceal": "tiny"}))


def test_wrong_type_names_key_and_value(tmp_path):
    with pytest.raises(ConfigError, match=r"tiny_model.pretrain.steps': value 'many'"):
        load_config(_write(tmp_path, {"tiny_model": {"pretrain": {"steps": "many"}}}))


def test_enum_value_named(tmp_path):
    with pytest.raises(ConfigError, match=r"quantize.formats.1': value 'fp3'"):
        load_config(_write(tmp_path, {"quantize": {"formats": ["nvfp4", "fp3"]}}))


def test_unknown_method_named():
    with pytest.raises(ConfigError, match=r"key 'train.methods.1': value 'qlorra' is not a trainable method; "
                                          r"allowed: .*did you mean 'qlora'"):
        validate_config({"train": {"methods": ["lora", "qlorra"]}})


TRAINABLE = r"is not a trainable method; allowed: \['full', 'lora', 'qlora', 'mxfp4_lora', 'nvfp4_lora', 'qerl'\]"


@pytest.mark.parametrize("cfg, message", [
    ({"train": {"methods": ["lora", "qerl", "nf4"]}},
     rf"key 'train.methods.2': value 'nf4' {TRAINABLE}; 'nf4' is a weight format evaluated without training: "
     r"list it under evaluate.methods"),
    ({"train": {"tasks": {"t": {"source": "tiny", "algorithm": "grpo", "methods": ["bf16"]}}}},
     rf"key 'train.tasks.t.methods.0': value 'bf16' {TRAINABLE}"),
    ({"train": {"lr_by_method": {"mxfp4": 1.0e-4}}}, rf"key 'train.lr_by_method': 'mxfp4' \(a key of it\) {TRAINABLE}"),
    ({"train": {"ablations": {"method": "nvfp4"}}}, rf"key 'train.ablations.method': value 'nvfp4' {TRAINABLE}"),
    ({"evaluate": {"methods": ["bf16", "qerl"]}},
     r"key 'evaluate.methods.1': value 'qerl' is not an untrained weight format; allowed: "
     r"\['bf16', 'nf4', 'mxfp4', 'nvfp4'\]; 'qerl' is a trained method: list it under train.methods"),
], ids=["train.methods", "task methods", "lr_by_method", "ablations.method", "evaluate.methods"])
def test_each_method_list_holds_its_own_kind(cfg, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg, check_data=False)


def test_schema_method_lists_are_the_registry():
    schema = load_schema()["properties"]
    train = schema["train"]["properties"]
    trainable = [n for n, m in METHODS.items() if m.trainable != "none"]
    assert train["methods"]["items"]["enum"] == trainable
    assert train["tasks"]["additionalProperties"]["properties"]["methods"]["items"]["enum"] == trainable
    assert train["lr_by_method"]["propertyNames"]["enum"] == trainable
    assert train["ablations"]["properties"]["method"]["enum"] == trainable
    assert train["ablations"]["properties"]["lr_methods"]["items"]["enum"] == trainable
    assert schema["evaluate"]["properties"]["methods"]["items"]["enum"] == [n for n, m in METHODS.items()
                                                                           if m.trainable == "none"]


@pytest.mark.parametrize("text, hint", [
    ("4e-4", "write 4.0e-4"), ("-1E5", "write -1.0E5"), ("'0.5'", "write the number without quotes")])
def test_number_written_as_text_gets_a_hint(tmp_path, text, hint):
    path = tmp_path / "c.yaml"
    path.write_text(f"train:\n  lr: {text}\n")
    with pytest.raises(ConfigError, match=r"key 'train.lr': value '.*' should be of type number; .*" + hint):
        load_config(path)


def test_evaluated_benchmark_must_be_provided_by_data():
    with pytest.raises(ConfigError, match=r"key 'evaluate.benchmarks' names \['gsm8k'\], which 'data.benchmarks' "
                                          r"\(\[\]\) does not provide"):
        validate_config({"evaluate": {"benchmarks": ["tiny", "gsm8k"]}}, check_data=False)


def test_missing_data_file_named(tmp_path):
    cfg = {"data": {"root": str(tmp_path / "nowhere"), "download": False, "benchmarks": ["gsm8k"]}}
    with pytest.raises(ConfigError, match=r"data.root.*gsm8k/test.jsonl"):
        validate_config(cfg)


def test_present_data_files_pass(shared_data_root):
    cfg = validate_config({"data": {"root": str(shared_data_root), "download": False,
                                    "benchmarks": ["gsm8k", "math500", "aime24", "aime25", "amc23", "math_train"]}})
    assert cfg["data"]["root"] == str(shared_data_root)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")


def test_bad_yaml_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("scale: [tiny\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_cli_fails_fast_naming_key(tmp_path):
    path = _write(tmp_path, {"quantize": {"awq_gird": 3}})
    proc = subprocess.run([sys.executable, "-m", "qerl.cli", "check-config", "--config", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "awq_gird" in proc.stderr and "Traceback" not in proc.stderr


def test_methods_registry():
    assert {"full", "lora", "qlora", "mxfp4_lora", "nvfp4_lora", "qerl"} <= set(METHODS)
    assert get_method("qerl").aqn and not get_method("nvfp4_lora").aqn
    with pytest.raises(ValueError, match="known methods"):
        get_method("nope")


def test_unknown_method_in_ablations_named():
    with pytest.raises(ConfigError, match=r"train.ablations.lr_methods.0': value 'qlroa' is not a trainable method"):
        validate_config({"train": {"ablations": {"lr_methods": ["qlroa"]}}})


def test_unknown_task_key_named():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['groups'\] under 'train.tasks.t'"):
        validate_config({"train": {"tasks": {"t": {"source": "tiny", "algorithm": "grpo", "groups": 3}}}})


def test_gpu_jobs_at_once(repo_root, tmp_path):
    from qerl.config import gpu_jobs_at_once

    assert gpu_jobs_at_once(repo_root / "config" / "small.yaml") == 8  # 1 GPU x 8 jobs per GPU
    assert gpu_jobs_at_once(repo_root / "config" / "config.yaml") == 1  # the CPU scale: gpus 0
    cfg = tmp_path / "two.yaml"
    cfg.write_text("resources: {train: {gpus: 2, jobs_per_gpu: 3}}\n")
    assert gpu_jobs_at_once(cfg) == 6
