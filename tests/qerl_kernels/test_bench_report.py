"""bench_report's effective-bandwidth table (issue 22): layer sums and shares of the measured ceiling, on CPU."""
from qerl_kernels.bench_report import GROUPED_LAYERS, LAYERS, bandwidth_table


def _rows():
    rows = []
    for layer in LAYERS + tuple(g for g in GROUPED_LAYERS if g not in LAYERS):  # o_proj, down_proj once
        for method, ms, gbps in (("bf16", 0.020, 3000.0), ("nvfp4", 0.010, 1500.0), ("nvfp4_gluon", 0.005, 2000.0)):
            if layer in ("qkv_proj", "gate_up_proj") and method == "bf16":
                continue
            rows.append(dict(model="7B", layer=layer, M=1, method=method, median_ms=str(ms), gbps=str(gbps)))
    return rows


def test_bandwidth_table_sums_and_ceiling_shares():
    out = bandwidth_table(_rows(), 4000.0, "7B")
    row = next(line for line in out if line.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # 7 launches: bf16 140 us at 3000/4000 = 75 %; nvfp4 70 us (2.00x) at 38 %; gluon 35 us (4.00x bf16, 2.00x nvfp4)
    assert cells == ["1", "140.0", "75%", "70.0", "2.00", "38%", "35.0", "4.00", "2.00", "50%",
                     # 4 launches of the Gluon kernel: 20 us, against bf16's 7 GEMMs and nvfp4's 4 launches
                     "20.0", "7.00", "2.00"]


def test_bandwidth_table_empty_without_gluon_rows():
    rows = [r for r in _rows() if r["method"] != "nvfp4_gluon"]
    assert bandwidth_table(rows, 4000.0, "7B") == []
