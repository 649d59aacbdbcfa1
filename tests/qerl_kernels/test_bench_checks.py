"""The benchmark's correctness checker (qerl_kernels.bench._check_kernel), on the CPU with stand-in kernels: a kernel
that computes the float32 reference product passes at every format, dtype, M, bias and group; one 1 % off, one that
raises, and one that is not repeatable each give FAIL lines (reported, never raised), so a GPU run's "OK" means
something; and the loader of an earlier module version for before / after runs."""
import pytest
import torch

from qerl_kernels import bench
from qerl_kernels.layout import dequantize_prepared_reference


def exact(x, p, b):
    y = x.float() @ dequantize_prepared_reference(p).t()
    return (y + (b.float() if b is not None else 0)).to(x.dtype)


def check(kernel, groups=(), formats=("nvfp4",)):
    lines = []
    ok = bench._check_kernel("t", kernel, [(64, 256)], groups, lines, formats=formats, ms=(1, 3), group_ms=(2,),
                             bias_ms=(3,), device="cpu")
    return ok, lines


def test_the_reference_product_passes_everywhere():
    ok, lines = check(exact, groups=[[(32, 256), (64, 256)]], formats=("nvfp4", "mxfp4"))
    assert ok and len(lines) == 5 and all(line.endswith(" OK") for line in lines)
    assert lines[0].startswith("check nvfp4_t bfloat16 N=64 K=256: max rel err")
    assert lines[-1].startswith("check nvfp4_t bfloat16 group [32, 64]x256")


def test_wrong_raising_and_unrepeatable_kernels_fail_without_raising():
    ok, lines = check(lambda x, p, b: (exact(x, p, b).float() * 1.01).to(x.dtype))
    assert not ok and all(line.endswith(" FAIL") for line in lines)

    def raises(x, p, b):
        raise RuntimeError("out of resources")
    ok, lines = check(raises)
    assert not ok and all("RuntimeError: out of resources FAIL" in line for line in lines)
    calls = []

    def drifts(x, p, b):  # a different last bit on every call: a split-K reduction in arrival order
        calls.append(1)
        y = exact(x, p, b)
        y[0, 0] += (len(calls) % 2) * 0.05 * y[0, 0].abs().clamp(min=1)
        return y
    ok, lines = check(drifts)
    assert not ok and all("repeatable=False" in line for line in lines)


def test_an_earlier_module_version_loads_from_its_file_for_a_before_after_run(tmp_path):
    """bench.load_module_file imports a source file (an earlier commit's module) beside ours; bench_lora's
    --decode-file then times that module's kernels; step_trace's --engine-file takes an engine class the same way;
    a missing file is named."""
    from pathlib import Path

    import qerl_kernels
    from qerl_kernels import bench_lora, decode
    from qerl.profiling.step_trace import _load_engine_class
    src = Path(qerl_kernels.__file__).parent / "decode.py"
    old = tmp_path / "decode_before.py"
    old.write_text(src.read_text().replace("SILU_LORA_SPLITS = 128", "SILU_LORA_SPLITS = 64"))
    mod = bench.load_module_file(old, "decode_before_test")
    assert mod is not decode and mod.SILU_LORA_SPLITS == 64 and decode.SILU_LORA_SPLITS == 128
    try:
        bench_lora.use_decode(str(old))
        assert bench_lora.decode.SILU_LORA_SPLITS == 64
    finally:
        bench_lora.decode = decode
    engine = Path(qerl_kernels.__file__).parent.parent / "qerl" / "rl" / "engine.py"
    assert _load_engine_class(str(engine)).__name__ == "DecodeEngine"
    with pytest.raises(FileNotFoundError, match="no file"):
        bench.load_module_file(tmp_path / "missing.py", "x")


def test_the_attention_split_sweep_times_every_count_against_the_rule(monkeypatch, capsys):
    """bench_attention (GPU tool) on the CPU, the graph timer stood in for and a two-layer 7B-like shape: every
    split count from 2 up to span / 64 and the rule's own, each pass in turn (the second reversed), the outputs
    checked against the rule's count's."""
    from qerl_kernels import bench_attention
    monkeypatch.setitem(bench_attention.SHAPES, "tiny", (4, 2, 16, 2, 16))
    calls = []

    def timer(fn):
        fn()
        calls.append(1)
        return 10.0 * (len(calls) % 3 + 1)
    rows = bench_attention.sweep("tiny", [1], [256], [2, 3, 8, 16], passes=2, timer=timer, device="cpu")
    rule = rows[0]["rule"]
    assert rule == 4  # one 64-key block a split (attention_splits)
    assert [r["splits"] for r in rows] == [2, 3, 4] and all(len(r["us"]) == 2 for r in rows)  # 8, 16 > span / 64
    assert all(r["max_diff"] < 0.05 for r in rows)
    out = capsys.readouterr().out
    assert out.index("pass 0 splits 2:") < out.index("pass 0 splits 3:")
    assert out.index("pass 1 splits 3:") < out.index("pass 1 splits 2:")
    table = bench_attention.markdown(rows)
    assert f"{rule}*:" in table and "| tiny | 1 | 256 |" in table
