"""The knob sweeps of qerl_kernels.tune (GPU tools, `run_device.sh` runs them) end to end on the CPU, with the
kernels, the device and the CUDA-graph timer stood in for: every case of every shape and M is built, every knob set is
tried and reported, and a knob set that raises is reported and skipped rather than ending the sweep."""
import types

import pytest
import torch

from qerl_kernels import fp4_gemv, fp4_gluon, fp4_mma, fp4_wgmma, tune
from qerl_kernels.layout import dequantize_prepared_reference

# the device is stood in for: on a machine with a GPU, torch's lazy CUDA start-up reads the fake properties and fails
# (the real sweeps run there through run_device.sh)
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="stands in for the GPU")


def exact(x, p, b=None, **knobs):
    return (x.float() @ dequantize_prepared_reference(p).t()).to(x.dtype)


@pytest.fixture
def on_cpu(monkeypatch):
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **kw: randn(*a, **kw))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(L2_cache_size=1 << 16))
    monkeypatch.setattr(tune, "time_calls", lambda fns, **kw: (fns[0]() is not None and 1e-3, None))
    for mod, name in ((fp4_gluon, "fp4_gemm_gluon"), (fp4_wgmma, "fp4_gemm_wgmma"), (fp4_gemv, "fp4_gemm_gemv"),
                      (fp4_mma, "fp4_gemm_mma")):
        monkeypatch.setattr(mod, name, exact)
    monkeypatch.setattr(tune, "GLUON_SWEEP", tune.GLUON_SWEEP[:2])
    monkeypatch.setattr(tune, "WGMMA_SWEEP", tune.WGMMA_SWEEP[:2])
    monkeypatch.setattr(tune, "MMA_SWEEP", tune.MMA_SWEEP[:2])
    monkeypatch.setattr(tune, "MMA_TILED_SWEEP", tune.MMA_TILED_SWEEP[:2])
    monkeypatch.setattr(tune, "MMA_ROWS_SWEEP", [dict(KW=2, CPB=12, MAXNREG=80), dict(KW=2, SPLIT=2, TILED=1)])
    return types.SimpleNamespace(dtype="bf16", shapes=["256x512"], m=[1, 16], tiled=True, rows=True)


@pytest.mark.parametrize("kernel", ["gluon", "wgmma", "gemv", "mma"])
def test_every_case_and_knob_set_is_timed(on_cpu, capsys, kernel):
    assert getattr(tune, f"sweep_{kernel}")(on_cpu) == 0
    out = capsys.readouterr().out
    assert out.count(f"{kernel} best 256x512") == 2  # one line per M
    assert "M=1 " in out and "M=16 " in out and "err " in out
    if kernel == "mma":  # --tiled: the same knob sets again on tile_prepared's copies
        assert out.count("mma-tiled best 256x512") == 2 and out.count("mma-tiled 256x512 M=1 warps") == 2
        # --rows: the row-block grid's knob sets (one row-major, one tiled)
        assert out.count("mma-rows best 256x512") == 2 and out.count("mma-rows 256x512 M=16 KW=2") == 2


def test_a_knob_set_that_raises_is_reported_and_skipped(on_cpu, capsys, monkeypatch):
    def out_of_resources(*a, **k):
        raise RuntimeError("out of resources")
    monkeypatch.setattr(fp4_wgmma, "fp4_gemm_wgmma", out_of_resources)
    assert tune.sweep_wgmma(on_cpu) == 0
    out = capsys.readouterr().out
    assert out.count("RuntimeError out of resources") == 4 and "wgmma best" not in out


def test_rows_knobs_epilogue_and_passes(on_cpu, capsys, monkeypatch):
    """--rows-knobs replaces MMA_ROWS_SWEEP, --epilogue lora gives every call (the default path's too) the LoRA update
    and residual, --passes 2 times every set twice (the second pass reversed) and the default path again at the end."""
    seen = []

    def record(x, p, b=None, **kw):
        if "config" in kw:  # not the heuristic's call the sweep times first
            seen.append((kw["config"].get("CPB"), kw.get("lora") is not None and kw.get("residual") is not None))
        return exact(x, p)
    monkeypatch.setattr(fp4_mma, "fp4_gemm_mma", record)
    on_cpu.m, on_cpu.tiled, on_cpu.rows, on_cpu.rows_only = [1], True, False, True   # no stream-K sweeps
    on_cpu.rows_knobs = [tune.parse_knobs("KW=8,CPB=3,MAXNREG=96,PRE=2"), tune.parse_knobs("kw=4,cpb=6")]
    on_cpu.epilogue, on_cpu.passes = "lora", 2
    assert tune.sweep_mma(on_cpu) == 0
    out = capsys.readouterr().out
    assert [c for c, _ in seen] == [3, 3, 6, 6, 6, 6, 3, 3] and all(e for _, e in seen)  # checked, then timed
    assert out.count("mma-rows best 256x512 M=1 (knobs, pass") == 2 and "KW=4 CPB=6:" in out
    assert "default path" in out and " first, " in out and "mma best" not in out and "mma-tiled" not in out
    with pytest.raises(ValueError, match="NAME=integer"):
        tune.parse_knobs("KW=8,CPB")
