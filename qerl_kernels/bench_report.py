"""What a qerl_kernels.bench run writes from its measurements: kernels.summary.md (per model and M, the GEMMs of one
decoder layer summed and set against bf16, NF4 and the measured bandwidth ceiling (bench.read_ceiling); issue 15's
targets; issue 22's effective-bandwidth tables with the Gluon kernel and the skinny-M kernel, the latter also per
launch; q/k/v and gate/up grouped), kernels.png (speedup over bf16 per M) and the provenance table of
kernels.provenance.md.

Rows are kernels.csv's (one per model, layer, M, method; bench.py measures them). Layer sums are over the 7
GEMMs of a decoder layer (LAYERS) or, with q/k/v and gate/up each one launch, over 4 launches (GROUPED_LAYERS), and
only where every launch was measured. Targets (TARGETS, BWD_TARGET): forward x bf16 per M range, backward nvfp4 /
bf16 time.
"""
from __future__ import annotations

import datetime
import platform
import subprocess
import sys

import torch

__all__ = ["LAYERS", "GROUPED_LAYERS", "TARGETS", "BWD_TARGET", "layer_sums", "bandwidth_table", "gemv_shape_table",
           "wgmma_shape_table", "grouped_table", "targets_table", "summarize", "plot", "provenance"]

LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUPED_LAYERS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # one layer with q/k/v and gate/up fused


def layer_sums(rows, model, method, layers=LAYERS):
    """{M: summed ms over the launches `layers` of one decoder layer} (only where all were measured): the 7 GEMMs
    by default, GROUPED_LAYERS for the 4 launches with q/k/v and gate/up fused."""
    acc: dict[int, list[float]] = {}
    for r in rows:
        if r["model"] == model and r["method"] == method and r["layer"] in layers:
            acc.setdefault(r["M"], []).append(float(r["median_ms"]))
    return {m: sum(v) for m, v in acc.items() if len(v) == len(layers)}


def grouped_table(rows, ceiling_gbs, model) -> list[str]:
    """Layer sums with q/k/v and gate/up as one launch each, against bf16 unfused (the issue's definition) and
    bf16 with the same fusion (what an inference engine would run)."""
    bf7 = layer_sums(rows, model, "bf16")
    bf4, nv4 = layer_sums(rows, model, "bf16", GROUPED_LAYERS), layer_sums(rows, model, "nvfp4", GROUPED_LAYERS)
    nv7 = layer_sums(rows, model, "nvfp4")
    bb7, nb4 = layer_sums(rows, model, "bf16_bwd"), layer_sums(rows, model, "nvfp4_bwd", GROUPED_LAYERS)
    bb4, nb7 = layer_sums(rows, model, "bf16_bwd", GROUPED_LAYERS), layer_sums(rows, model, "nvfp4_bwd")
    if not nv4:
        return []
    wbytes = sum(int(r["weight_bytes"]) for r in rows if r["model"] == model and r["method"] == "nvfp4"
                 and r["layer"] in GROUPED_LAYERS and r["M"] == min(nv4))
    nweights = sum(int(r["N"]) * int(r["K"]) for r in rows if r["model"] == model and r["method"] == "nvfp4"
                   and r["layer"] in GROUPED_LAYERS and r["M"] == min(nv4))
    out = [f"## Qwen2.5-{model}, q/k/v and gate/up fused: 4 launches per layer (nvfp4 weights: "
           f"{8 * wbytes / nweights:.3f} bits per weight as held on the GPU)", "",
           "| M | bf16 7 GEMMs us | bf16 fused 4 GEMMs us | nvfp4 4 launches us | x bf16 (7) | x bf16 (fused) | "
           "nvfp4 weight GB/s | % ceiling (weights) | nvfp4 7 launches x bf16 | bwd nvfp4/bf16 (7) | "
           "bwd grouped nvfp4/bf16 fused |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in sorted(nv4):
        nv = nv4[m]
        gbs = wbytes / nv / 1e6
        cells = [str(m), f"{bf7[m] * 1e3:.1f}" if m in bf7 else "-", f"{bf4[m] * 1e3:.1f}" if m in bf4 else "-",
                 f"{nv * 1e3:.1f}", f"{bf7[m] / nv:.2f}" if m in bf7 else "-", f"{bf4[m] / nv:.2f}" if m in bf4 else "-",
                 f"{gbs:.0f}", f"{100 * gbs / ceiling_gbs:.0f}%",
                 f"{bf7[m] / nv7[m]:.2f}" if m in bf7 and m in nv7 else "-",
                 f"{nb7[m] / bb7[m]:.2f}" if m in nb7 and m in bb7 else "-",
                 f"{nb4[m] / bb4[m]:.2f}" if m in nb4 and m in bb4 else "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


TARGETS = ((1, 16, 3.0), (64, 64, 2.5), (128, 128, 1.4), (256, 1 << 30, 1.0))  # issue 15: (M from, to, x bf16)
BWD_TARGET = 1.1  # backward: nvfp4 / bf16 time at most this, every M


def targets_table(rows, model) -> list[str]:
    """Issue 15's kernel targets per M: the 7-GEMM layer sum against bf16's 7 GEMMs, and q/k/v + gate/up grouped
    (4 launches) against bf16 grouped the same way; the backward as nvfp4 / bf16 time (7 GEMMs)."""
    bf7, nv7 = layer_sums(rows, model, "bf16"), layer_sums(rows, model, "nvfp4")
    bf4, nv4 = layer_sums(rows, model, "bf16", GROUPED_LAYERS), layer_sums(rows, model, "nvfp4", GROUPED_LAYERS)
    bb, nb = layer_sums(rows, model, "bf16_bwd"), layer_sums(rows, model, "nvfp4_bwd")
    if not nv7:
        return []
    out = [f"## Issue 15 targets, Qwen2.5-{model} (forward: x bf16, higher is better; backward: nvfp4/bf16 time)", "",
           "| M | target fwd | fwd 7 GEMMs | fwd grouped (4 vs 4) | met? | bwd nvfp4/bf16 | bwd met (<= 1.1)? |",
           "|---|---|---|---|---|---|---|"]
    for m in sorted(nv7):
        tgt = next((t for lo, hi, t in TARGETS if lo <= m <= hi), None)
        f7 = bf7[m] / nv7[m] if m in bf7 else None
        f4 = bf4[m] / nv4[m] if m in bf4 and m in nv4 else None
        best = max(v for v in (f7, f4) if v is not None) if (f7 or f4) else None
        b = nb[m] / bb[m] if m in nb and m in bb else None
        out.append(f"| {m} | {'>= %.1f' % tgt if tgt else '-'} | {f7:.2f} | {f'{f4:.2f}' if f4 else '-'} | "
                   f"{'-' if tgt is None or best is None else ('yes' if best >= tgt else 'no')} | "
                   f"{f'{b:.2f}' if b else '-'} | {'-' if b is None else ('yes' if b <= BWD_TARGET else 'no')} |")
    return out + [""]


def bandwidth_table(rows, ceiling_gbs, model, method: str = "nvfp4_gluon") -> list[str]:
    """Issue 22: the 7-GEMM layer sums of bf16 (cuBLAS), the default NVFP4 path and `method` (the Gluon kernel, or
    the skinny-M kernel nvfp4_gemv), each with its effective bandwidth (weight + activation bytes moved / time) as
    a share of the measured read ceiling; then `method` over the 4 launches of the grouped layer."""
    meths = ("bf16", "nvfp4", method)
    sums = {m: layer_sums(rows, model, m) for m in meths}
    if not sums[method]:
        return []
    moved = {}
    for r in rows:
        if r["model"] == model and r["method"] in meths and r["layer"] in LAYERS:
            moved.setdefault((r["method"], r["M"]), []).append(float(r["gbps"]) * float(r["median_ms"]) * 1e6)
    short = method.split("_", 1)[1]
    out = [f"## Qwen2.5-{model}, 7 GEMMs summed: effective bandwidth (weights + activations / time) vs the "
           f"measured ceiling {ceiling_gbs:.0f} GB/s ({method})", "",
           f"| M | bf16 us | bf16 % ceiling | nvfp4 (default) us | x bf16 | % ceiling | {method} us | x bf16 | "
           f"x default | % ceiling | {short} 4 launches us | x bf16 (7) | x default (4) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    g4, n4 = layer_sums(rows, model, method, GROUPED_LAYERS), layer_sums(rows, model, "nvfp4", GROUPED_LAYERS)
    for m in sorted(sums[method]):
        cells = [str(m)]
        for meth in meths:
            t = sums[meth].get(m)
            pct = (f"{100 * sum(moved[(meth, m)]) / (t * 1e6) / ceiling_gbs:.0f}%"
                   if t and len(moved.get((meth, m), ())) == len(LAYERS) else "-")
            cells.append(f"{t * 1e3:.1f}" if t else "-")
            if meth != "bf16":
                cells.append(f"{sums['bf16'][m] / t:.2f}" if t and m in sums["bf16"] else "-")
            if meth == method:
                cells.append(f"{sums['nvfp4'][m] / t:.2f}" if t and m in sums["nvfp4"] else "-")
            cells.append(pct)
        g = g4.get(m)
        cells += [f"{g * 1e3:.1f}" if g else "-", f"{sums['bf16'][m] / g:.2f}" if g and m in sums["bf16"] else "-",
                  f"{n4[m] / g:.2f}" if g and m in n4 else "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _launches(rows, model, method) -> tuple[dict, list]:
    """The per-launch tables' rows of `model` by (layer, M, method), and the (layer, M) pairs `method` was timed
    at, in layer order (the 7 layers, then the groups; others last), then by M."""
    order = LAYERS + GROUPED_LAYERS
    t = {(r["layer"], r["M"], r["method"]): r for r in rows if r["model"] == model}
    keys = sorted({(r["layer"], r["M"]) for r in rows if r["model"] == model and r["method"] == method},
                  key=lambda lm: (order.index(lm[0]) if lm[0] in order else len(order), lm[1]))
    return t, keys


def wgmma_shape_table(rows, model) -> list[str]:
    """Issue 22, per launch: the wgmma kernel (nvfp4_wgmma) against cuBLAS and the default path on every shape and
    M, with the tensor-core rate each reaches (TFLOP/s: 2 M N K / time) and the wgmma kernel's share of the read
    ceiling: which of the two bounds a launch sits at (kernels.notes.md predicts both per 7B shape)."""
    t, keys = _launches(rows, model, "nvfp4_wgmma")
    if not keys:
        return []
    out = [f"## Qwen2.5-{model}: the wgmma kernel per launch (us; x = the other's time / this one's)", "",
           "| layer | M | bf16 | nvfp4 (default) | nvfp4_wgmma | x bf16 | x default | wgmma TFLOP/s | bf16 TFLOP/s | "
           "wgmma % ceiling |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for layer, m in keys:
        r = {meth: t.get((layer, m, meth)) for meth in ("bf16", "nvfp4", "nvfp4_wgmma")}
        us = {meth: float(v["median_ms"]) * 1e3 if v else None for meth, v in r.items()}
        bf, nv, wg = us["bf16"], us["nvfp4"], us["nvfp4_wgmma"]
        cells = [layer, str(m)] + [f"{v:.1f}" if v else "-" for v in (bf, nv, wg)]
        cells += [f"{bf / wg:.2f}" if bf else "-", f"{nv / wg:.2f}" if nv else "-", r["nvfp4_wgmma"]["tflops"],
                  r["bf16"]["tflops"] if r["bf16"] else "-", f"{r['nvfp4_wgmma']['pct_ceiling']}%"]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def gemv_shape_table(rows, model, kind: str = "gemv") -> list[str]:
    """Issue 22 item 4, per launch: a decode-size kernel (kind "gemv": nvfp4_gemv / mxfp4_gemv, the skinny-M kernel;
    "mma": nvfp4_mma / mxfp4_mma, the register-operand MMA kernel) against cuBLAS and the default path on every
    shape and M, with its share of the read ceiling (pct_ceiling)."""
    nk, mk = f"nvfp4_{kind}", f"mxfp4_{kind}"
    t, keys = _launches(rows, model, nk)
    if not keys:
        return []
    name = {"gemv": "the skinny-M kernel", "mma": "the decode-size MMA kernel"}.get(kind, kind)
    out = [f"## Qwen2.5-{model}: {name} per launch (us; x = the other's time / this one's)", "",
           f"| layer | M | bf16 | nvfp4 (default) | {nk} | x bf16 | x default | % ceiling | mxfp4 (default) | "
           f"{mk} | x default |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]

    def us(key):
        r = t.get(key)
        return float(r["median_ms"]) * 1e3 if r else None

    for layer, m in keys:
        bf, nv, ng = us((layer, m, "bf16")), us((layer, m, "nvfp4")), us((layer, m, nk))
        mx, mg = us((layer, m, "mxfp4")), us((layer, m, mk))
        cells = [layer, str(m)] + [f"{v:.1f}" if v else "-" for v in (bf, nv, ng)]
        cells += [f"{bf / ng:.2f}" if bf and ng else "-", f"{nv / ng:.2f}" if nv and ng else "-",
                  f"{t[(layer, m, nk)]['pct_ceiling']}%" if ng else "-"]
        cells += [f"{v:.1f}" if v else "-" for v in (mx, mg)] + [f"{mx / mg:.2f}" if mx and mg else "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def summarize(rows, ceiling_gbs, models, ms, lines) -> str:
    out = ["# FP4 W4A16 kernels: layer sums", "", *[f"- {l}" for l in lines], ""]
    for model in models:
        out += targets_table(rows, model)
    for model in models:
        out += bandwidth_table(rows, ceiling_gbs, model)
        out += bandwidth_table(rows, ceiling_gbs, model, "nvfp4_gemv")
        out += gemv_shape_table(rows, model)
        out += bandwidth_table(rows, ceiling_gbs, model, "nvfp4_mma")
        out += gemv_shape_table(rows, model, "mma")
        out += bandwidth_table(rows, ceiling_gbs, model, "nvfp4_wgmma")
        out += wgmma_shape_table(rows, model)
    for model in models:
        out += grouped_table(rows, ceiling_gbs, model)
    for model in models:
        bf = layer_sums(rows, model, "bf16")
        if not bf:
            continue
        wbytes = {}
        for meth in ("nvfp4", "mxfp4"):
            wbytes[meth] = sum(int(r["weight_bytes"]) for r in rows if r["model"] == model and r["method"] == meth
                               and r["M"] == min(bf) and r["layer"] in LAYERS)
        out += [f"## Qwen2.5-{model} (7 GEMMs of one decoder layer, summed)", "",
                "| M | bf16 us | nvfp4 us | x bf16 | nvfp4 weight GB/s | % ceiling (weights) | mxfp4 x bf16 | nf4 us | "
                "nvfp4 x nf4 | bwd nvfp4/bf16 | fused x bf16 | deq+cuBLAS x bf16 | tc x bf16 | bwd tc/bf16 |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        sums = {meth: layer_sums(rows, model, meth) for meth in
                ("nvfp4", "mxfp4", "nf4", "bf16_bwd", "nvfp4_bwd", "nvfp4_fused", "nvfp4_deq_cublas", "nvfp4_tc",
                 "nvfp4_bwd_tc")}
        for m in sorted(bf):
            nv = sums["nvfp4"].get(m)
            cells = [str(m), f"{bf[m] * 1e3:.1f}"]
            cells.append(f"{nv * 1e3:.1f}" if nv else "-")
            cells.append(f"{bf[m] / nv:.2f}" if nv else "-")
            gbs = wbytes["nvfp4"] / nv / 1e6 if nv else None
            cells.append(f"{gbs:.0f}" if gbs else "-")
            cells.append(f"{100 * gbs / ceiling_gbs:.0f}%" if gbs else "-")
            mx = sums["mxfp4"].get(m)
            cells.append(f"{bf[m] / mx:.2f}" if mx else "-")
            nf = sums["nf4"].get(m)
            cells.append(f"{nf * 1e3:.1f}" if nf else "-")
            cells.append(f"{nf / nv:.2f}" if nf and nv else "-")
            bb, nb = sums["bf16_bwd"].get(m), sums["nvfp4_bwd"].get(m)
            cells.append(f"{nb / bb:.2f}" if bb and nb else "-")
            fu, dq = sums["nvfp4_fused"].get(m), sums["nvfp4_deq_cublas"].get(m)
            cells.append(f"{bf[m] / fu:.2f}" if fu else "-")
            cells.append(f"{bf[m] / dq:.2f}" if dq else "-")
            tc, btc = sums["nvfp4_tc"].get(m), sums["nvfp4_bwd_tc"].get(m)
            cells.append(f"{bf[m] / tc:.2f}" if tc else "-")
            cells.append(f"{btc / bb:.2f}" if btc and bb else "-")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def plot(rows, models, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        bf = layer_sums(rows, model, "bf16")
        for meth, style in (("nvfp4", "o-"), ("mxfp4", "s--"), ("nf4", "^:"), ("nvfp4_bwd", "x-.")):
            s = layer_sums(rows, model, meth)
            base = layer_sums(rows, model, "bf16_bwd") if meth.endswith("_bwd") else bf
            ms = sorted(m for m in s if m in base and m > 0)
            if ms:
                ax.plot(ms, [base[m] / s[m] for m in ms], style, label=meth)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_title(f"Qwen2.5-{model}: speedup over bf16")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("x bf16 (layer sum)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})  # no tool URL in the file


def provenance(args, extra: dict) -> str:
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        driver = "unknown"
    import triton
    rows = {
        "GPU": f"{props.name} ({props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB, "
               f"{props.total_memory >> 30} GiB)",
        "driver": driver,
        "CUDA (torch)": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": args.commit or "unknown",
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "command": args.command or " ".join(sys.argv),
    }
    rows.update(extra)
    return "\n".join(f"| {k} | {v} |" for k, v in rows.items())
