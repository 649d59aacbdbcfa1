"""Every artifact renders from synthetic runs: paper and ours columns, mean +/- std, figures, "not measured"."""
from __future__ import annotations

import csv
import math
import shutil

import pytest

from qerl.report.accuracy_tables import config_value
from qerl.report.context import Context, Needs
from qerl.report.registry import ARTIFACTS, get_artifact, input_files, output_files, render_artifact

EXPECTED = {f"table{n}" for n in range(1, 10)} | {f"fig{n}" for n in (1, 3, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                                                       16, 17)} | {"figbatch", "tableaqn", "figmismatch"}  # beyond the paper


@pytest.fixture(scope="module")
def rendered(synthetic, tmp_path_factory):
    cfg, _ = synthetic
    out = tmp_path_factory.mktemp("out")
    paths = {a: render_artifact(a, cfg) for a in ARTIFACTS}
    return cfg, paths, out


def _csv(path):
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def test_registry_covers_exactly_the_paper_artifacts():
    assert set(ARTIFACTS) == EXPECTED
    for a in ARTIFACTS.values():
        assert a.kind == ("table" if a.id.startswith("table") else "figure")
        assert a.title and a.caption and a.category
    with pytest.raises(ValueError, match="unknown artifact 'fig2'"):
        get_artifact("fig2")


def test_every_artifact_renders_where_the_registry_says(rendered):
    cfg, paths, _ = rendered
    for a in ARTIFACTS.values():
        written = paths[a.id]
        assert [str(p) for p in written] == output_files(a, cfg)
        for p in written:
            assert p.exists() and p.stat().st_size > 0
        if a.kind == "figure":
            png, pdf = written
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
            assert pdf.read_bytes()[:5] == b"%PDF-"


def test_tables_have_paper_and_ours_columns_and_header(rendered):
    _, paths, _ = rendered
    for n in range(1, 10):
        md, tex, csv_path, page = paths[f"table{n}"]
        text = md.read_text()
        header = text.splitlines()[2]
        if n in (1, 2):  # provenance of the runs: commit and hardware from eval.json / run.json
            assert "(inputs from abc1234)" in header and "CPU test" in header, header
        # the seeds and model of what the table read: our runs (1, 2; 9's rank ablation on the ablation seeds), or
        # none for the measured GPU files (3, 5-8) and the config (4)
        seeds = {1: "seeds: 0, 1, 2", 2: "seeds: 0, 1, 2", 9: "seeds: 0, 1"}.get(n, "seeds: none (no run read)")
        model = "model: tiny" if n in (1, 2, 9) else "model: n/a (no run read)"
        for field in ("scale: tiny", model, seeds, "commit: ", "hardware: "):
            assert field in header, (n, header)
        columns = _csv(csv_path)[0].keys()
        assert any(c.startswith("paper") for c in columns), (n, list(columns))
        assert any(c.startswith("ours") for c in columns), (n, list(columns))
        assert r"\begin{tabular}" in tex.read_text() and "# scale: tiny" in csv_path.read_text()


def test_tables_as_html_pages(rendered):
    """What the Snakemake report displays: the same cells as the Markdown, in an HTML table, escaped."""
    import html
    from html.parser import HTMLParser

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.cells, self.classes, self._in = [], [], False

        def handle_starttag(self, tag, attrs):
            if tag in ("td", "th"):
                self._in = True
                self.cells.append("")
                self.classes.append(dict(attrs).get("class"))

        def handle_endtag(self, tag):
            self._in = self._in and tag not in ("td", "th")

        def handle_data(self, data):
            if self._in:
                self.cells[-1] += data

    _, paths, _ = rendered
    for n in range(1, 10):
        md, _, _, page = paths[f"table{n}"]
        text = page.read_text()
        assert text.startswith("<!DOCTYPE html>") and "<script" not in text
        parser = Cells()
        parser.feed(text)
        grid = [line for line in md.read_text().splitlines() if line.startswith("| ")]
        md_cells = [c.strip().replace("\\|", "|") for line in grid for c in line[2:-2].split(" | ")]
        assert parser.cells == md_cells, n  # every cell of the Markdown table, in order
        assert {"key", "paper", "ours"} <= set(parser.classes), n
        assert html.escape(md.read_text().splitlines()[0][2:]) in text  # the title


def test_table1_mean_and_std_over_seeds(rendered):
    _, paths, _ = rendered
    md, _, csv_path, _ = paths["table1"]
    rows = _csv(csv_path)
    tiny = {(r["W#"], r["training"]): r for r in rows if r["model"] == "tiny"}
    qerl = tiny[("NVFP4", "LoRA + AQN")]
    assert float(qerl["ours (tiny): tiny"]) == pytest.approx(55.0)
    assert float(qerl["ours (tiny): tiny std"]) == pytest.approx(math.sqrt(13.0), abs=1e-5)
    assert qerl["ours (tiny): tiny n"] == "3"
    assert qerl["paper: GSM8K"] == ""  # our rows never fill the paper's columns
    assert float(tiny[("BF16", "-")]["ours (tiny): tiny"]) == pytest.approx(30.0)  # untrained, stage's own layout
    assert float(qerl["ours (tiny): tiny L1"]) == pytest.approx(60.0)  # per level: value + 10 - 5 * level
    paper_row = next(r for r in rows if r["model"] == "3B" and r["training"] == "LoRA + AQN")
    assert float(paper_row["paper: GSM8K"]) == 83.7 and paper_row["ours (tiny): tiny"] == ""
    assert "| tiny | NVFP4 | LoRA + AQN |  | 55.0 ± 3.6 |" in md.read_text()


def test_table2_dapo_rows(rendered):
    _, paths, _ = rendered
    rows = _csv(paths["table2"][2])
    qerl = next(r for r in rows if r["model"] == "tiny" and r["training"] == "LoRA + AQN")
    assert float(qerl["ours (tiny): tiny"]) == pytest.approx(45.0)
    assert float(next(r for r in rows if r["model"] == "32B" and r["training"] == "Full")["paper: avg"]) == 46.2


def test_measured_tables_say_not_measured_without_files(rendered):
    _, paths, _ = rendered
    for n in (3, 5, 6, 7, 8):
        md, _, csv_path, _ = paths[f"table{n}"]
        text = md.read_text()
        assert "not measured" in text and "absent" in text
        for row in _csv(csv_path):
            ours = [v for k, v in row.items() if k.startswith("ours") and not k.endswith((" std", " n"))]
            assert ours and all(v == "not measured" for v in ours), (n, row)
    rows = _csv(paths["table9"][2])
    measured_rows = [r for r in rows if r["model"] != "tiny"]
    assert all(r["ours: r16"] == "not measured" for r in measured_rows)
    runs = next(r for r in rows if r["model"] == "tiny")  # our QeRL rank runs: rollout_tokens / time_rollout
    assert float(runs["ours: r16"]) == pytest.approx((1000 / 2 + 1100 / 2) / 2)


def test_table4_from_config(rendered):
    cfg, paths, _ = rendered
    rows = {r["hyperparameter"]: r for r in _csv(paths["table4"][2])}
    ours = "ours (tiny): config"
    assert rows["samples per prompt"][ours] == "8 (tiny_grpo) / 16 (tiny_dapo)"
    assert rows["samples per prompt"]["paper"] == "8 (GSM8K) / 16 (BigMath)"
    train = cfg["train"]
    assert config_value({**train, "lr": 1e-5, "lr_by_method": {"lora": 5e-6}}, "lr") == "1e-05 (default) / 5e-06 (lora)"
    assert config_value({**train, "clip_eps_low": 0.2, "clip_eps_high": 0.28}, "clip_eps") == "0.2, 0.28"
    assert config_value({**train, "aqn": {**train["aqn"], "sigma_start": 0.01, "sigma_end": 5e-4}},
                        "sigma") == "0.01, 0.0005 (exponential)"
    assert config_value({**train, "tasks": {"t": {"source": "tiny", "algorithm": "grpo"}}},
                        "group_size") == "n/a (not configured)"  # no task sets it


def test_measured_files_fill_our_columns(synthetic, helpers, tmp_path):
    cfg, _ = synthetic
    results = tmp_path / "results"
    shutil.copytree(cfg["results_dir"], results)
    helpers.write_measured(results)
    cfg2 = {**cfg, "results_dir": str(results)}
    assert any("measured" in f for f in input_files(ARTIFACTS["table6"], cfg2))
    md, _, csv_path, _ = render_artifact("table6", cfg2)
    rows = {(r["method"], r["BS"]): r for r in _csv(csv_path)}
    o = "ours (measured, h100)"
    assert float(rows[("QeRL", "2")][f"{o}: E2E x w/o GC"]) == pytest.approx(1.25)
    assert float(rows[("QeRL", "2")][f"{o}: E2E x w/ GC"]) == pytest.approx(1.2)
    assert float(rows[("QeRL", "2")][f"{o}: rollout x"]) == pytest.approx(1.3)
    assert rows[("QeRL", "8")][f"{o}: E2E x w/o GC"] == "n/a (BF16 LoRA OOM)"  # no time in a ratio column
    assert rows[("LoRA", "8")][f"{o}: E2E x w/o GC"] == "OOM"
    assert float(rows[("QeRL", "8")]["paper: rollout tok/s"]) == 2091.8
    assert "NVIDIA H100" in md.read_text()
    t3 = {(r["model"], r["method"]): r for r in _csv(render_artifact("table3", cfg2)[2])}
    assert float(t3[("7B", "QLoRA")][f"{o}: x bs2"]) == pytest.approx(0.8)
    assert float(t3[("7B", "QeRL")][f"{o}: step s bs8"]) == 20.0 and t3[("7B", "LoRA")][f"{o}: step s bs8"] == "OOM"
    assert t3[("7B", "QeRL")][f"{o}: x bs8"] == "n/a (BF16 LoRA OOM)"
    assert t3[("14B", "QLoRA")][f"{o}: x bs2"] == "not measured"
    t9 = {(r["model"], r["W#"]): r for r in _csv(render_artifact("table9", cfg2)[2])}
    assert float(t9[("7B", "NVFP4")]["ours: r32"]) == 140.0
    for fig in ("fig1", "fig11"):
        png, _ = render_artifact(fig, cfg2)
        assert png.stat().st_size > 10_000


def test_rollouts_out_of_memory_render_as_such(synthetic, helpers, tmp_path):
    """rollout.csv rows whose tokens_per_s is "OOM" (the profiler writes them where a rollout ran out of GPU memory):
    the tables say OOM or n/a, the figures and the speed claim leave them out, nothing fails."""
    from qerl.report.claims import render_claims

    cfg, _ = synthetic
    results = tmp_path / "results"
    shutil.copytree(cfg["results_dir"], results)
    folder = helpers.write_measured(results)
    with open(folder / "rollout.csv", "a") as f:
        f.write("Qwen2.5-7B-Instruct,lora,16,256,OOM\nQwen2.5-7B-Instruct,qerl,16,256,9000\n"
                "Qwen2.5-7B-Instruct,lora,16,512,OOM\nQwen2.5-7B-Instruct,qerl,16,512,OOM\n")
    cfg2 = {**cfg, "results_dir": str(results)}
    rows = {(r["method"], r["BS"]): r for r in _csv(render_artifact("table6", cfg2)[2])}
    o = "ours (measured, h100)"
    assert rows[("LoRA", "256")][f"{o}: rollout tok/s"] == "OOM"
    assert float(rows[("QeRL", "256")][f"{o}: rollout tok/s"]) == 9000.0
    assert rows[("QeRL", "256")][f"{o}: rollout x"] == "n/a (BF16 LoRA OOM)"
    assert rows[("QeRL", "512")][f"{o}: rollout x"] == "OOM"
    for fig in ("fig1", "fig11", "figbatch"):
        png, _ = render_artifact(fig, cfg2)
        assert png.stat().st_size > 10_000
    text = render_claims(cfg2)
    assert "| 7B | 256 | n/a (BF16 LoRA OOM) |" in text and "| 7B | 512 | OOM |" in text
    assert "QeRL rollout 1.25-1.50x, >= 1.5x in 1 of 3 cells" in text  # the OOM cells are no ratio


def test_missing_run_file_fails_or_is_noted(synthetic, tmp_path):
    cfg, _ = synthetic
    results = tmp_path / "results"
    shutil.copytree(cfg["results_dir"], results)
    cfg2 = {**cfg, "results_dir": str(results)}
    victim = next(f for f in input_files(ARTIFACTS["fig8"], cfg2) if "noaqn" in f)
    (results / victim.split(str(results) + "/", 1)[1]).unlink()
    with pytest.raises(ValueError, match=r"input file .*noaqn.* does not exist"):
        render_artifact("fig8", cfg2)
    png, _ = render_artifact("fig8", cfg2, out_dir=tmp_path / "figs", allow_missing=True)
    assert png.parent == tmp_path / "figs" and png.stat().st_size > 0


def test_malformed_metrics_line_is_named(synthetic, tmp_path):
    cfg, _ = synthetic
    results = tmp_path / "results"
    shutil.copytree(cfg["results_dir"], results)
    cfg2 = {**cfg, "results_dir": str(results)}
    victim = next(f for f in input_files(ARTIFACTS["fig10"], cfg2) if "rank16" in f)
    with open(victim, "a") as f:
        f.write('{"step": 99, "reward": 1}\n')
    for old in (results / "tiny" / "figures").glob("fig10.*"):
        old.unlink()
    with pytest.raises(ValueError, match=r"metrics.jsonl:41: missing key"):
        render_artifact("fig10", cfg2)
    assert not (results / "tiny" / "figures" / "fig10.png").exists()  # nothing half-written


def test_unconfigured_role_and_methods_say_not_run(helpers, tmp_path):
    cfg = helpers.make_config(tmp_path / "results")
    cfg["train"]["tasks"] = {"tiny_grpo": cfg["train"]["tasks"]["tiny_grpo"]}
    cfg["train"]["methods"] = ["lora", "qerl"]
    helpers.write_inputs(cfg)
    assert input_files(ARTIFACTS["fig7"], cfg) == []
    assert ARTIFACTS["table1"].needs(cfg).skipped
    rows = _csv(render_artifact("table2", cfg)[2])
    tiny = [r for r in rows if r["model"] == "tiny"]
    assert tiny and all(r["ours (tiny): tiny"] == "not run" for r in tiny if r["training"] != "-")
    rows = _csv(render_artifact("table1", cfg)[2])
    full = next(r for r in rows if r["model"] == "tiny" and r["training"] == "Full")
    assert full["ours (tiny): tiny"] == "not run"
    assert "Not run in this config" in render_artifact("table1", cfg)[0].read_text()


def test_task_methods_narrow_one_role(helpers, tmp_path):
    """train.tasks.<task>.methods trains a subset on that task: its figures name only those runs and say the rest
    were not run there; the other task keeps every method; a method outside train.methods is a config error."""
    from qerl.config import ConfigError, validate_config
    from qerl.contract.grid import task_methods

    cfg = helpers.make_config(tmp_path / "results")
    cfg["train"]["tasks"]["tiny_dapo"]["methods"] = ["full", "lora", "nvfp4_lora", "qerl"]
    assert task_methods(cfg, "tiny_dapo") == ["full", "lora", "nvfp4_lora", "qerl"]
    assert task_methods(cfg, "tiny_grpo") == cfg["train"]["methods"]
    needs = ARTIFACTS["fig4"].needs(cfg)
    dapo = {r.method for r in needs.runs if r.role == "dapo"}
    grpo = {r.method for r in needs.runs if r.role == "grpo"}
    assert dapo == {"nvfp4_lora", "lora", "full"} and grpo == {"nvfp4_lora", "mxfp4_lora", "qlora", "lora", "full"}
    assert needs.skipped == ("DAPO task: mxfp4_lora, qlora (not in train.tasks.tiny_dapo.methods)",)
    assert not any("/tiny_dapo/tiny/qlora/" in f for f in input_files(ARTIFACTS["fig4"], cfg))
    helpers.write_inputs(cfg)
    rows = _csv(render_artifact("table2", cfg)[2])
    tiny = [r for r in rows if r["model"] == "tiny"]
    assert len(tiny) == 6 and all(r["ours (tiny): tiny"] not in ("", "not run") for r in tiny)
    bad = {**cfg, "train": {**cfg["train"], "tasks": {"tiny_dapo": {**cfg["train"]["tasks"]["tiny_dapo"],
                                                                    "methods": ["lora", "qlora"]}},
                            "methods": ["lora"]}}
    with pytest.raises(ConfigError, match=r"train\.tasks\.tiny_dapo\.methods.*\['qlora'\] not in train\.methods"):
        validate_config(bad, source="test config", check_data=False)


def test_paper_scale_model_shares_the_paper_rows(helpers, tmp_path):
    cfg = helpers.make_config(tmp_path / "results")
    cfg["model"]["name"] = "qwen2.5-7b"
    helpers.write_inputs(cfg)
    rows = _csv(render_artifact("table1", cfg)[2])
    row = next(r for r in rows if r["model"] == "7B" and r["training"] == "LoRA + AQN")
    assert float(row["paper: GSM8K"]) == 90.8 and float(row["ours (tiny): tiny"]) == pytest.approx(55.0)
    assert not any(r["model"] == "qwen2.5-7b" for r in rows)


def test_context_notes_skipped(helpers, tmp_path):
    cfg = helpers.make_config(tmp_path)
    ctx = Context(cfg, Needs(skipped=("qlora (not in train.methods)",)))
    assert ctx.notes == ["Not run in this config: qlora (not in train.methods)."]


def test_cli_render(helpers, tmp_path, capsys):
    import yaml

    from qerl.cli import main

    cfg = helpers.make_config(tmp_path / "results")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({k: cfg[k] for k in ("scale", "results_dir", "seeds", "model", "train",
                                                        "evaluate")}))
    assert main(["render", "--config", str(path), "--artifact", "table4", "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "table4.md").exists() and "table4.csv" in capsys.readouterr().out
    assert main(["render", "--config", str(path), "--artifact", "table42"]) == 2
    assert "unknown artifact 'table42'" in capsys.readouterr().err
    assert main(["render", "--config", str(path), "--artifact", "table1"]) == 2  # no runs yet
    assert "does not exist" in capsys.readouterr().err


def test_render_all_with_nothing_run(helpers, tmp_path):
    cfg = helpers.make_config(tmp_path / "results")
    chosen = [a for a in ARTIFACTS if a.startswith("table")] + ["fig1", "fig8", "fig15"]  # figures: one per renderer
    for artifact_id in chosen:
        for p in render_artifact(artifact_id, cfg, allow_missing=True):
            assert p.stat().st_size > 0
    text = (tmp_path / "results" / "tiny" / "tables" / "table1.md").read_text()
    assert "Missing input skipped" in text and "n/a" in text


def test_fig8_compares_the_same_seeds(synthetic):
    cfg, _ = synthetic
    runs = ARTIFACTS["fig8"].needs(cfg).runs
    assert {r.variant for r in runs} == {"default", "noaqn"}
    assert {r.seeds for r in runs} == {(0, 1)}  # train.ablations.seeds for both curves, not 3 seeds against 2


def test_captions_say_which_figures_show_the_same_runs(synthetic):
    from qerl.report.registry import caption_rst

    cfg, _ = synthetic
    assert "Same data: this is Fig. 7's plot" in caption_rst(ARTIFACTS["fig12"])
    assert "Fig. 5" in caption_rst(ARTIFACTS["fig3"]) and "Fig. 3's entropy panel" in caption_rst(ARTIFACTS["fig5"])
    for fig, twin in (("fig7", "fig12"), ("fig7", "fig13"), ("fig3", "fig5"), ("fig9", "fig15")):
        assert set(input_files(ARTIFACTS[twin], cfg)) <= set(input_files(ARTIFACTS[fig], cfg))  # really the same
        assert ARTIFACTS[fig].same_data and ARTIFACTS[twin].same_data, (fig, twin)  # and said so, both ways


def test_measured_tables_name_their_seeds_ranks_and_peak(synthetic, helpers, tmp_path):
    cfg, _ = synthetic
    results = tmp_path / "results"
    shutil.copytree(cfg["results_dir"], results)
    folder = helpers.write_measured(results)
    with open(folder / "rollout.csv", "a") as f:  # batch 4 measured at rank 32 only
        f.write("Qwen2.5-7B-Instruct,lora,32,4,500\nQwen2.5-7B-Instruct,qerl,32,4,600\n")
    (folder / "memory.csv").write_text(
        "model,method,model_size_gb,peak_gb,batch,gradient_checkpointing\n"
        "Qwen2.5-7B-Instruct,lora,15.23,40.1,2,true\nQwen2.5-7B-Instruct,qerl,5.91,20.5,2,true\n")
    cfg2 = {**cfg, "results_dir": str(results)}
    text = render_artifact("table6", cfg2)[0].read_text()
    assert "model: per row (measured files) | seeds: none (no run read)" in text
    assert "hardware: GPU NVIDIA H100 80GB HBM3 (measured files)" in text
    assert "rollout at the smallest LoRA rank measured at each batch: rank 16 at batch 1, 2, 8, rank 32 at batch 4" \
        in text
    t3 = render_artifact("table3", cfg2)[2].read_text()
    assert "ours (measured, h100): peak (GB), bs2 with GC" in t3


def test_single_seed_tables_do_not_claim_a_spread(synthetic, helpers, tmp_path):
    cfg = helpers.make_config(tmp_path / "results")
    cfg["train"]["ablations"]["seeds"] = [0]
    helpers.write_inputs(cfg)
    text = render_artifact("table9", cfg)[0].read_text()
    assert "one seed (0): single values, no spread" in text and "mean ± std" not in text
