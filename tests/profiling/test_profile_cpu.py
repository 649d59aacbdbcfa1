"""The profiling stage's CPU-checkable parts: architecture table, random-weight builder, model size accounting,
the resumable CSV, and a clear error without a GPU."""
from __future__ import annotations

import json
import pytest
import torch

from qerl.profiling.archs import ARCHS, Arch, qwen25_config
from qerl.profiling.build import build_random_model, random_base
from qerl.contract.measured import MeasuredCsv
from qerl.profiling.run import _Csv, model_size_bytes


def test_architectures_have_the_published_sizes():
    # parameter counts of the released Qwen2.5-Instruct models (billions, as published)
    for name, billions in {"3B": 3.09, "7B": 7.62, "14B": 14.77, "32B": 32.76, "72B": 72.71}.items():
        assert abs(ARCHS[name].params / 1e9 - billions) < 0.01, name
    cfg = qwen25_config("7B", layers=2)
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.num_hidden_layers) == (3584, 4, 2)
    with pytest.raises(ValueError, match="unknown architecture"):
        qwen25_config("8B")


@pytest.mark.parametrize("weights", ["bf16", "nvfp4"])
def test_random_base_matches_the_architecture(weights):
    a = ARCHS["0.5B"]
    model = random_base("0.5B", weights, layers=1, device="cpu", dtype=torch.bfloat16)
    per_layer_linear = a.linear_params // a.layers
    emb = a.vocab * a.hidden  # tied
    rest = a.hidden + 2 * a.kv_heads * a.head_dim + 2 * a.hidden + a.hidden  # q/k/v biases, two norms, final norm
    size = model_size_bytes(model) - 2 * 4 * a.head_dim // 2  # RoPE inv_freq and its original copy (float32)
    if weights == "bf16":
        assert size == 2 * (per_layer_linear + emb + rest)
    else:  # 4 bits + one E4M3 scale per 16 weights + a 4-byte global scale per layer (7 layers)
        assert size == per_layer_linear // 2 + per_layer_linear // 16 + 7 * 4 + 2 * (emb + rest)
    assert not any(p.requires_grad for p in model.parameters())
    x = torch.randint(0, 1000, (1, 4))
    assert torch.isfinite(model(input_ids=x).logits.float()).all()


def test_lora_model_size_excludes_adapters(monkeypatch):
    # a narrow 1-layer shape (the accounting is per tensor; 0.5B's widths took ~7 s): 64-wide, 0.5B's vocabulary
    narrow = Arch("narrow", hidden=64, intermediate=128, layers=1, heads=4, kv_heads=2, vocab=ARCHS["0.5B"].vocab,
                  tied=True)
    monkeypatch.setitem(ARCHS, narrow.name, narrow)
    lora = build_random_model(narrow.name, "qerl", rank=8, device="cpu")
    assert any(p.requires_grad for p in lora.parameters())
    assert model_size_bytes(lora) == model_size_bytes(random_base(narrow.name, "nvfp4", device="cpu"))


def test_csv_appends_and_resumes(tmp_path):
    spec = MeasuredCsv("r.csv", ("model", "batch", "tokens_per_s"), key=("model", "batch"), required=())
    path = tmp_path / "r.csv"
    f = _Csv(tmp_path, spec)
    f.add(model="7B", batch=1, tokens_per_s=123.456)
    again = _Csv(tmp_path, spec)
    assert again.has(model="7B", batch=1) and not again.has(model="7B", batch=8)
    again.add(model="7B", batch=8, tokens_per_s="OOM")
    assert path.read_text().splitlines() == ["model,batch,tokens_per_s", "7B,1,123.5", "7B,8,OOM"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_profile_without_gpu_says_so(tmp_path, capsys):
    from qerl.cli import main
    assert main(["profile", "--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_record_dispatch_keeps_each_label(tmp_path, monkeypatch):
    """qerl profile writes the kernels' dispatch choices beside its CSVs, one entry per model/method, keeping the
    earlier ones (a resumed run adds to the file); a model without 4-bit layers gets {} (the table is per process:
    a BF16 model measured after a 4-bit one launched none of its choices)."""
    from torch import nn

    from qerl.layers import QuantLinear
    from qerl.profiling.run import record_dispatch
    from qerl_kernels import fp4_launch

    four_bit = nn.Sequential(QuantLinear.from_linear(nn.Linear(32, 16), "nvfp4"))
    monkeypatch.setattr(fp4_launch, "_DISPATCH", {(3584, 18944, 256, "bf16", 0, False, 0, True, True): "wgmma"})
    record_dispatch(tmp_path, "Qwen2.5-7B/qerl", four_bit)
    monkeypatch.setattr(fp4_launch, "_DISPATCH", {(3584, 18944, 256, "bf16", 0, False, 0, True, True): "swap"})
    record_dispatch(tmp_path, "Qwen2.5-7B/nvfp4_lora", four_bit)
    table = record_dispatch(tmp_path, "Qwen2.5-7B/lora", nn.Sequential(nn.Linear(32, 16)))
    assert json.loads((tmp_path / "dispatch.json").read_text()) == table
    assert table["Qwen2.5-7B/qerl"] == {"(3584, 18944, 256, 'bf16', 0, False, 0, True, True)": "wgmma"}
    assert list(table["Qwen2.5-7B/nvfp4_lora"].values()) == ["swap"]
    assert table["Qwen2.5-7B/lora"] == {}


def test_profile_frees_each_model_before_building_the_next(tmp_path, monkeypatch):
    """Each method's model is unreachable before the next method's is built (a 32B BF16 model left alive by a
    dangling name made the next build run out of memory on an 80 GB card). CPU stand-ins for the GPU calls."""
    import gc
    import importlib
    import weakref

    importlib.import_module("peft")  # while torch still says no GPU: peft's optional bitsandbytes import checks it

    from qerl.config import load_config
    from qerl.profiling import build, run

    built, real_base = [], build.random_base

    def fake_base(arch, weights, layers=None, device="cuda"):
        gc.collect()
        assert all(r() is None for r in built), "the previous method's model is still alive"
        model = real_base(arch, weights, layers=1, device="cpu", dtype=torch.bfloat16)
        built.append(weakref.ref(model))
        return model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)  # profile() sets it: undone after the test
    for fn in ("empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, fn, lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(build, "random_base", fake_base)
    monkeypatch.setattr(run, "rollout_timing", lambda model, batch, plen, comp, full=False: dict(
        peak=0, tokens_per_s=1.0, timing="buckets", prompt_tokens=plen, completion_tokens=comp, prefill_s=0.0,
        decode_s=0.0, graphs=0, capture_s=0.0))
    monkeypatch.setattr(run, "record_dispatch", lambda *a, **k: {})
    cfg = load_config("config/paper.yaml")
    assert run.profile(cfg, tmp_path, archs=["0.5B"], methods=["lora", "qerl"], ranks=[32], batches=[1],
                       full_batches=[], e2e_batches=[], prompt=4, completion=4)
    assert len(built) == 2
