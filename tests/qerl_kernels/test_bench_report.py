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


def test_gemv_rows_give_tables_and_measured_table_entries():
    from qerl_kernels.bench import gemv_wins
    from qerl_kernels.bench_report import gemv_shape_table

    rows = []
    for layer, n, k in (("gate_proj", 18944, 3584), ("down_proj", 3584, 18944)):
        for method, ms in (("bf16", 0.050, ), ("nvfp4", 0.025), ("nvfp4_gemv", 0.020), ("mxfp4", 0.025),
                           ("mxfp4_gemv", 0.0249 if layer == "gate_proj" else 0.030)):
            rows.append(dict(model="7B", layer=layer, N=n, K=k, M=4, method=method, median_ms=str(ms), gbps="1.0",
                             pct_ceiling="61.0"))
    out = gemv_shape_table(rows, "7B")
    cells = [c.strip() for c in next(line for line in out if line.startswith("| gate_proj")).strip("|").split("|")]
    assert cells == ["gate_proj", "4", "50.0", "25.0", "20.0", "2.50", "1.25", "61.0%", "25.0", "24.9", "1.00"]
    wins = gemv_wins(rows, "h100")
    # nvfp4_gemv beats the default by 20 % on both shapes; mxfp4_gemv by 0.4 % (under the 3 % margin) or not at all
    assert len(wins) == 2 and all(w.lstrip().startswith("('h100', 0, 'bf16', ") for w in wins)
    assert "18944, 3584, 4): {}," in wins[1] and "gemv 20.0 us, default 25.0 us" in wins[1]


def test_wgmma_shape_table_per_launch_rates():
    from qerl_kernels.bench_report import wgmma_shape_table

    rows = [dict(model="7B", layer="gate_proj", N=18944, K=3584, M=256, method=meth, median_ms=str(ms), gbps="1.0",
                 pct_ceiling=pct, tflops=tf)
            for meth, ms, pct, tf in (("bf16", 0.120, "40.0", "289.6"), ("nvfp4", 0.150, "9.0", "231.7"),
                                      ("nvfp4_wgmma", 0.080, "17.0", "434.4"))]
    out = wgmma_shape_table(rows, "7B")
    cells = [c.strip() for c in next(line for line in out if line.startswith("| gate_proj")).strip("|").split("|")]
    assert cells == ["gate_proj", "256", "120.0", "150.0", "80.0", "1.50", "1.88", "434.4", "289.6", "17.0%"]
    assert wgmma_shape_table([r for r in rows if r["method"] != "nvfp4_wgmma"], "7B") == []
