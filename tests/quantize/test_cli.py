"""`qerl calibrate` and `qerl quantize` end to end on a tiny Qwen2 checkpoint with the tiny scale's tokenizer."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from qerl.cli import main
from qerl.layers import QuantLinear


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from qerl.data.tiny import generate_split
    from qerl.models.tiny import build_model, build_tokenizer

    root = tmp_path_factory.mktemp("cli")
    tok = build_tokenizer()
    model = build_model(tok, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                        max_position=64, seed=0)
    base = root / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    data = root / "rl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in generate_split(0, 60, [1, 2, 3], "rl")))
    cfg = {"results_dir": str(root / "results"), "quantize": {
        "formats": ["nvfp4", "mxfp4", "nf4"], "awq_grid": 3, "heldout_sequences": 2,
        "calibration": {"n_sequences": 4, "seq_len": 32, "seed": 0}}}
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return root, base, data, config


def test_calibrate_then_quantize_nvfp4(setup):
    from qerl.quantize.awq import load_scales
    from qerl.policy.checkpoint import load_quantized

    root, base, data, config = setup
    scales = root / "awq" / "nvfp4.safetensors"
    assert main(["calibrate", "--config", str(config), "--base", str(base), "--format", "nvfp4",
                 "--calib", str(data), "--out", str(scales)]) == 0
    assert load_scales(scales).fmt == "nvfp4" and len(load_scales(scales).scales) == 2 * 4
    out = root / "q" / "nvfp4"
    assert main(["quantize", "--config", str(config), "--base", str(base), "--format", "nvfp4",
                 "--calib", str(data), "--scales", str(scales), "--out", str(out)]) == 0
    report = json.loads((out / "layer_errors.json").read_text())
    assert report["method"] == "awq" and len(report["awq"]["per_layer"]) == 14
    assert 0 < report["awq"]["mean"] < 0.3 and 0 < report["rtn"]["mean"] < 0.3
    model = load_quantized(out)
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 14
    assert (out / "tokenizer.json").is_file() and not list(root.glob("q/.nvfp4*"))  # no temp folder left behind
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[5, 6, 7, 8]])).logits).all()


def test_quantize_rtn_mxfp4_and_nf4(setup):
    from baselines.nf4 import bitsandbytes_cpu_problem
    from qerl.policy.checkpoint import load_quantized

    root, base, data, config = setup
    out = root / "q" / "mxfp4"
    assert main(["quantize", "--config", str(config), "--base", str(base), "--format", "mxfp4",
                 "--calib", str(data), "--out", str(out)]) == 0
    report = json.loads((out / "layer_errors.json").read_text())
    assert report["method"] == "rtn" and "awq" not in report
    assert load_quantized(out).model.layers[0].mlp.up_proj.fmt == "mxfp4"
    if bitsandbytes_cpu_problem():
        pytest.skip(bitsandbytes_cpu_problem())
    out = root / "q" / "nf4"
    assert main(["quantize", "--config", str(config), "--base", str(base), "--format", "nf4",
                 "--calib", str(data), "--out", str(out)]) == 0
    assert (out / "nf4_recipe.json").is_file()
    assert json.loads((out / "layer_errors.json").read_text())["rtn"]["mean"] < 0.3
    model = load_quantized(out, dtype=torch.float32)
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"


def test_cli_errors_are_one_clear_line(setup, capsys):
    root, base, data, config = setup
    bad = root / "bad.yaml"
    bad.write_text(yaml.safe_dump({"quantize": {"formats": ["nvfp4"], "calibration": {"n_sequences": 4,
                                                                                    "seq_len": 32}}}))
    assert main(["quantize", "--config", str(bad), "--base", str(base), "--format", "mxfp4",
                 "--calib", str(data), "--out", str(root / "x")]) == 2
    assert "not in config quantize.formats" in capsys.readouterr().err
    bad.write_text(yaml.safe_dump({"quantize": {"calibration": {"n_sequences": 5000, "seq_len": 32}}}))
    assert main(["calibrate", "--config", str(bad), "--base", str(base), "--format", "nvfp4",
                 "--calib", str(data), "--out", str(root / "x.safetensors")]) == 2
    assert "but 5000 are needed" in capsys.readouterr().err
