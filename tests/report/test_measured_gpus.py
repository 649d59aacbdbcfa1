"""The measured GPU folder is chosen per model: two folders (h100 with 7B; h200 with 7B and 14B, other numbers), each
model's numbers from the first folder that has it (h100 first), labelled with that GPU wherever models meet, and
profile.measured_gpu reading one folder alone."""
from __future__ import annotations

import csv
import json
import shutil

import pytest

from qerl.report.claims import render_claims
from qerl.report.context import Context, Needs, measured_folders
from qerl.report.registry import ARTIFACTS, input_files, render_artifact
from qerl.report.speed import e2e_speedup

# {gpu: (rollout rows, e2e rows, memory rows, ceilings)}; 7B differs between the folders, 14B is on h200 alone
_SEVEN, _FOURTEEN = "Qwen2.5-7B-Instruct", "Qwen2.5-14B-Instruct"
FOLDERS = {
    "h100": ([(_SEVEN, "lora", 16, 1, 100), (_SEVEN, "qerl", 16, 1, 150), (_SEVEN, "qlora", 16, 1, 110),
              (_SEVEN, "lora", 32, 1, 100), (_SEVEN, "qerl", 32, 1, 150), (_SEVEN, "lora", 32, 8, 700),
              (_SEVEN, "qerl", 32, 8, 1050), (_SEVEN, "lora", 32, 64, 4000), (_SEVEN, "qerl", 32, 64, 4400)],
             [(_SEVEN, "lora", 2, "false", 10), (_SEVEN, "qerl", 2, "false", 8), (_SEVEN, "lora", 2, "true", 12),
              (_SEVEN, "qerl", 2, "true", 10)],
             [(_SEVEN, "lora", 15.23, 40.1), (_SEVEN, "qerl", 5.91, 20.5)],
             {"read_gbs": 3000, "tflops": 800, "source": "h100 bench"}),
    "h200": ([(_SEVEN, "lora", 16, 1, 200), (_SEVEN, "qerl", 16, 1, 260), (_SEVEN, "lora", 32, 1, 200),
              (_SEVEN, "qerl", 32, 1, 260), (_SEVEN, "lora", 32, 8, 1400), (_SEVEN, "qerl", 32, 8, 1540),
              (_SEVEN, "lora", 32, 64, 8000), (_SEVEN, "qerl", 32, 64, 8000),
              (_FOURTEEN, "lora", 16, 1, 50), (_FOURTEEN, "qerl", 16, 1, 80), (_FOURTEEN, "lora", 32, 1, 50),
              (_FOURTEEN, "qerl", 32, 1, 80), (_FOURTEEN, "lora", 32, 8, 300), (_FOURTEEN, "qerl", 32, 8, 420),
              (_FOURTEEN, "lora", 32, 64, 1500), (_FOURTEEN, "qerl", 32, 64, 1650)],
             [(_SEVEN, "lora", 2, "false", 9), (_SEVEN, "qerl", 2, "false", 6),
              (_FOURTEEN, "lora", 2, "false", 20), (_FOURTEEN, "qerl", 2, "false", 12.5)],
             [(_SEVEN, "lora", 15.0, 30.0), (_SEVEN, "qerl", 5.5, 15.0),
              (_FOURTEEN, "lora", 29.5, 60.0), (_FOURTEEN, "qerl", 10.5, 25.0)],
             {"read_gbs": 4400, "tflops": 790, "source": "h200 bench"}),
}
_HEADERS = {"rollout.csv": "model,method,rank,batch,tokens_per_s", "e2e.csv":
            "model,method,batch,gradient_checkpointing,step_s", "memory.csv": "model,method,model_size_gb,peak_gb"}
_GPU_NAMES = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}


def _write_folders(results, gpus=("h100", "h200")):
    for gpu in gpus:
        folder = results / "measured" / gpu
        folder.mkdir(parents=True, exist_ok=True)
        rollout, e2e, memory, ceilings = FOLDERS[gpu]
        for name, rows in (("rollout.csv", rollout), ("e2e.csv", e2e), ("memory.csv", memory)):
            (folder / name).write_text("\n".join([_HEADERS[name], *(",".join(map(str, r)) for r in rows)]) + "\n")
        (folder / "ceilings.json").write_text(json.dumps(ceilings))
        (folder / "provenance.json").write_text(json.dumps({"gpu": _GPU_NAMES[gpu]}))


@pytest.fixture(scope="module")
def two_gpus(synthetic, tmp_path_factory):
    """(cfg, results) with the synthetic runs and both measured folders."""
    cfg, _ = synthetic
    results = tmp_path_factory.mktemp("two_gpus") / "results"
    shutil.copytree(cfg["results_dir"], results)
    _write_folders(results)
    return {**cfg, "results_dir": str(results)}, results


def _csv(path):
    return list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))


def _only(cfg, gpu):
    return {**cfg, "profile": {**cfg["profile"], "measured_gpu": gpu}}


def test_each_model_reads_the_first_folder_that_has_it(two_gpus):
    cfg, results = two_gpus
    ctx = Context(cfg, Needs(measured=("rollout.csv",)))
    assert ctx.measured_sources() == {"7B": results / "measured" / "h100", "14B": results / "measured" / "h200"}
    rows = ctx.measured("rollout.csv")
    assert {(r["model"], r["gpu"]) for r in rows} == {("7B", "h100"), ("14B", "h200")}  # no h200 7B row
    assert sorted(r["tokens_per_s"] for r in rows if r["model"] == "7B" and r["batch"] == 1 and r["rank"] == 16) \
        == [100.0, 110.0, 150.0]
    assert [r["gpu"] for r in ctx.measured("e2e.csv", "14B")] == ["h200"] * 2
    assert ctx.measured_mixed() and ctx.measured_model("7B") == "7B (h100)"
    assert ctx.measured_label("14B") == "ours (measured, h200)" and ctx.measured_label() == "ours (measured)"


def test_folder_order_prefers_h100_then_names(helpers, tmp_path):
    cfg = helpers.make_config(tmp_path / "results")
    for gpu in ("h200", "a100", "h100", "cpu"):
        (tmp_path / "results" / "measured" / gpu).mkdir(parents=True)
        if gpu != "cpu":  # a folder without a profiling CSV is no candidate
            (tmp_path / "results" / "measured" / gpu / "e2e.csv").write_text(_HEADERS["e2e.csv"] + "\n")
    assert [p.name for p in measured_folders(cfg)] == ["h100", "a100", "h200"]
    assert [p.name for p in measured_folders(_only(cfg, "h200"))] == ["h200"]


def test_tables_of_one_model_read_and_name_its_gpu(two_gpus):
    cfg, _ = two_gpus
    md, _, csv_path, _ = render_artifact("table6", cfg)
    rows = {(r["method"], r["BS"]): r for r in _csv(csv_path)}
    o = "ours (measured, h100)"
    assert float(rows[("QeRL", "1")][f"{o}: rollout tok/s"]) == 150.0  # h100's 7B, not h200's 260
    assert float(rows[("QeRL", "1")][f"{o}: rollout x"]) == pytest.approx(1.5)
    assert float(rows[("QeRL", "2")][f"{o}: E2E x w/o GC"]) == pytest.approx(1.25)  # 10 / 8, not h200's 9 / 6
    assert float(rows[("QeRL", "2")][f"{o}: size (GB)"]) == pytest.approx(5.91)
    assert "h200" not in md.read_text()  # header sources and hardware: the 7B folder alone
    md, _, csv_path, _ = render_artifact("table7", cfg)
    rows = {(r["method"], r["BS"]): r for r in _csv(csv_path)}
    o = "ours (measured, h200)"
    assert float(rows[("QeRL", "1")][f"{o}: rollout tok/s"]) == 80.0
    assert float(rows[("QeRL", "1")][f"{o}: rollout x"]) == pytest.approx(1.6)
    assert float(rows[("QeRL", "2")][f"{o}: E2E x w/o GC"]) == pytest.approx(1.6)
    assert float(rows[("QeRL", "2")][f"{o}: size (GB)"]) == pytest.approx(10.5)
    assert "/h100/" not in md.read_text() and "H200" in md.read_text()


def test_a_models_files_all_come_from_its_folder(two_gpus, tmp_path):
    """h100 lacks memory.csv: 7B's sizes read "not measured" (h200's 7B sizes are not mixed in) and say why."""
    cfg, results = two_gpus
    copy = tmp_path / "results"
    shutil.copytree(results, copy)
    (copy / "measured" / "h100" / "memory.csv").unlink()
    md, _, csv_path, _ = render_artifact("table6", {**cfg, "results_dir": str(copy)})
    rows = {(r["method"], r["BS"]): r for r in _csv(csv_path)}
    assert rows[("QeRL", "1")]["ours (measured, h100): size (GB)"] == "not measured"
    assert float(rows[("QeRL", "1")]["ours (measured, h100): rollout tok/s"]) == 150.0
    assert f"{copy}/measured/h100/memory.csv absent" in md.read_text()


def test_tables_spanning_models_mark_the_gpu_per_model(two_gpus):
    cfg, results = two_gpus
    md, _, csv_path, _ = render_artifact("table3", cfg)
    t3 = {(r["model"], r["method"]): r for r in _csv(csv_path)}
    o = "ours (measured)"
    assert t3[("7B", "QeRL")]["ours: GPU"] == "h100" and t3[("14B", "QeRL")]["ours: GPU"] == "h200"
    assert float(t3[("7B", "QeRL")][f"{o}: x bs2"]) == pytest.approx(1.25)  # h100: 10 / 8
    assert float(t3[("14B", "QeRL")][f"{o}: x bs2"]) == pytest.approx(1.6)  # h200: 20 / 12.5
    assert float(t3[("7B", "QeRL")][f"{o}: model size (GB)"]) == pytest.approx(5.91)
    assert (f"GPU per model (column 'ours: GPU'): 7B: h100 ({results}/measured/h100/); "
            f"14B: h200 ({results}/measured/h200/).") in md.read_text()
    md, _, csv_path, _ = render_artifact("table9", cfg)
    t9 = {(r["model"], r["W#"]): r for r in _csv(csv_path)}
    assert t9[("7B", "NVFP4")]["ours: GPU"] == "h100" and float(t9[("7B", "NVFP4")]["ours: r16"]) == 150.0
    assert t9[("14B", "NVFP4")]["ours: GPU"] == "h200" and float(t9[("14B", "NVFP4")]["ours: r16"]) == 80.0
    assert (f"7B: h100 ({results}/measured/h100/rollout.csv); 14B: h200 ({results}/measured/h200/rollout.csv)"
            in md.read_text())


def test_claims_mark_the_gpu_per_model(two_gpus):
    cfg, results = two_gpus
    text = render_claims(cfg)
    assert "| 7B (h100) | 1 | 1.50 |" in text and "| 14B (h200) | 1 | 1.60 |" in text
    assert "| 7B (h100) | 2 | not measured | 1.25 | 1.20 |" in text
    assert "| 14B (h200) | 2 | not measured | 1.60 |" in text
    assert (f"GPU per model (in the model column): 7B: h100 ({results}/measured/h100/); "
            f"14B: h200 ({results}/measured/h200/).") in text
    assert "- 7B (h100), QeRL / BF16 LoRA rollout tok/s by batch: 1: 1.50, 8: 1.50, 64: 1.10" in text
    assert "- 14B (h200), QeRL / BF16 LoRA rollout tok/s by batch: 1: 1.60, 8: 1.40, 64: 1.10" in text


def test_figures_mark_the_gpu_and_draw_the_models_ceilings(two_gpus):
    from qerl.report.figures import pyplot

    cfg, results = two_gpus
    artifact = ARTIFACTS["figbatch"]
    fig = artifact.renderer(Context(cfg, artifact.needs(cfg)), artifact)
    text = " ".join(" ".join(t.get_text() for t in fig.texts).split())
    lines = {line.get_label(): list(line.get_ydata()) for ax in fig.axes for line in ax.lines}
    assert lines["7B (h100) QeRL (NVFP4) (measured)"] == pytest.approx([1.5, 1.5, 1.1])
    assert lines["14B (h200) QeRL (NVFP4) (measured)"] == pytest.approx([1.6, 1.4, 1.1])
    assert f"Ceilings of 7B, from the GPU it was measured on (h100): {results}/measured/h100/ceilings.json" in text
    assert "read 3000 GB/s, bf16 800 TFLOP/s" in text
    pyplot().close(fig)
    artifact = ARTIFACTS["fig11"]
    fig = artifact.renderer(Context(cfg, artifact.needs(cfg)), artifact)
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert "7B (ours: h100)" in panels and "14B (ours: h200)" in panels
    heights = [p.get_height() for p in panels["7B (ours: h100)"].patches]
    assert 150.0 in heights and 260.0 not in heights
    assert "7B: h100" in " ".join(" ".join(t.get_text() for t in fig.texts).split())
    pyplot().close(fig)


def test_inputs_list_every_folder(two_gpus):
    cfg, results = two_gpus
    files = input_files(ARTIFACTS["table6"], cfg)
    for gpu in ("h100", "h200"):
        for name in ("rollout.csv", "e2e.csv", "memory.csv", "provenance.json"):
            assert f"{results}/measured/{gpu}/{name}" in files
    assert {f"{results}/measured/{g}/ceilings.json" for g in ("h100", "h200")} <= set(
        input_files(ARTIFACTS["figbatch"], cfg))
    assert not any("/h100/" in f for f in input_files(ARTIFACTS["table3"], _only(cfg, "h200")))


def test_measured_gpu_reads_that_folder_alone(two_gpus):
    cfg, _ = two_gpus
    cfg = _only(cfg, "h200")
    md, _, csv_path, _ = render_artifact("table6", cfg)
    rows = {(r["method"], r["BS"]): r for r in _csv(csv_path)}
    o = "ours (measured, h200)"
    assert float(rows[("QeRL", "1")][f"{o}: rollout tok/s"]) == 260.0
    assert float(rows[("QeRL", "2")][f"{o}: E2E x w/o GC"]) == pytest.approx(1.5)  # 9 / 6
    assert "/h100/" not in md.read_text()
    t3 = {(r["model"], r["method"]): r for r in _csv(render_artifact("table3", cfg)[2])}
    assert "ours: GPU" not in t3[("7B", "QeRL")]  # one folder: its name is in every column label instead
    assert float(t3[("7B", "QeRL")]["ours (measured, h200): x bs2"]) == pytest.approx(1.5)
    text = render_claims(cfg)
    assert "| 7B | 1 | 1.30 |" in text and "| 14B | 1 | 1.60 |" in text and "GPU per model" not in text


def test_a_speedup_never_divides_two_gpus():
    rows = [{"model": "7B", "method": "lora", "batch": 2, "gc": False, "step_s": 10.0, "gpu": "h200"},
            {"model": "7B", "method": "qerl", "batch": 2, "gc": False, "step_s": 8.0, "gpu": "h100"}]
    with pytest.raises(AssertionError, match="across GPUs"):
        e2e_speedup(rows, "7B", "qerl", 2, False)
    assert e2e_speedup([{**r, "gpu": "h100"} for r in rows], "7B", "qerl", 2, False) == pytest.approx(1.25)
