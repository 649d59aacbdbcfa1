"""The whole DAG end to end at a trimmed tiny size: every table and figure is produced, non-empty, every table
has the paper's column beside ours, the claim-by-claim comparison is written, and the Snakemake report shows each
table (and the claims) as an HTML page, checked in a real browser where Chromium is installed. Then, on copies of
that finished DAG (the base model and the other runs need no rebuilding): a resume without the weights
(workflow/resume.sh), and a training job killed in its evaluation then rerun with --rerun-incomplete. Every
Snakemake run here hands its jobs to one job server (qerl/jobserver.py) that this file starts, rather than to one
its Snakefile starts per run (tests/test_small_smoke.py runs that path). Minutes on 2 cores (the default tiny scale
itself is `make reproduce`)."""
from __future__ import annotations

import base64
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from qerl.report.registry import ARTIFACTS, TABLE_FORMATS
from tests.snakemake_cli import SNAKEMAKE, snakemake

# the environment NOT activated: this interpreter's bin folder removed from PATH, as after a plain
# `.venv/bin/snakemake`; the Snakefile itself must make the jobs' `qerl` and `python` this environment's
_BIN = str(Path(sys.executable).parent)
ENV = {**os.environ, "PATH": os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != _BIN)}
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.fixture(scope="module")
def job_server(tmp_path_factory):
    """The environment of this file's Snakemake runs: ENV with $QERL_JOB_SERVER naming one job server for all of
    them. Their configs turn resources.job_server off, so no run starts a server of its own: the Snakefile's server
    imports the stages again in each run (~6-7 CPU-seconds: the trimmed DAG, both Snakemake runs of
    workflow/resume.sh that have jobs), and the rerun's `qerl train` below would import them itself."""
    from qerl import jobserver

    path = jobserver.start(os.getpid(), log=tmp_path_factory.mktemp("job_server") / "job_server.log")
    yield {**ENV, jobserver.ENV_VAR: path}
    jobserver.stop(path)


def _config(trimmed_config, results) -> dict:
    """The trimmed config writing under `results`, its jobs served by this file's job server (`job_server`)."""
    cfg = trimmed_config(results)
    cfg["resources"]["job_server"] = False
    return cfg


@pytest.fixture(scope="module")
def trimmed_dag(repo_root, tmp_path_factory, trimmed_config, job_server):
    """Run the trimmed DAG once (its .snakemake/ in a temporary folder, not the checkout), then its report."""
    work = tmp_path_factory.mktemp("dag")
    path = work / "trimmed.yaml"
    path.write_text(yaml.safe_dump(_config(trimmed_config, work / "results")))
    # one thread per job (calibrate and quantize ask for 2): jobs run side by side, and beside the other pytest-xdist
    # worker; a 2-thread job on two busy cores ran 3-6x slower than with one
    command = ["-s", str(repo_root / "Snakefile"), "-d", str(work), "--cores", "2", "--max-threads", "1",
               "--configfile", str(path)]
    proc = snakemake(command, timeout=1500, env=job_server)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = work / "report.html"
    proc = snakemake(command + ["--report", str(report)], timeout=600, env=job_server)
    assert proc.returncode == 0 and report.exists(), (proc.stdout + proc.stderr)[-4000:]
    return {"results": work / "results" / "tiny", "report": report}


@pytest.mark.slow
def test_trimmed_tiny_dag_builds_every_artifact(trimmed_dag):
    out = trimmed_dag["results"]
    for name in ARTIFACTS:
        suffixes = [f".{ext}" for ext in TABLE_FORMATS] if name.startswith("table") else (".png", ".pdf")
        folder = out / ("tables" if name.startswith("table") else "figures")
        for suffix in suffixes:
            f = folder / f"{name}{suffix}"
            assert f.exists() and f.stat().st_size > 0, f
        if name.startswith("table"):
            lines = [line for line in open(folder / f"{name}.csv") if not line.startswith("#")]
            header = next(csv.reader(lines))
            if "not a paper" not in ARTIFACTS[name].title:  # beyond-the-paper tables have no paper column
                assert any(h.startswith("paper") for h in header), (name, header)
            assert any(h.startswith("ours") for h in header), (name, header)
    metrics = (out / "runs/tiny_grpo/tiny/qerl/default/seed0/metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 2
    assert (out / "runs/tiny_dapo/tiny/qerl/default/seed0/eval.json").exists()
    assert not (out / "runs/tiny_dapo/tiny/qlora").exists()  # the DAPO task trains its own methods only
    chunks = sorted(p.name for p in (out / "runs/tiny_grpo/tiny/qerl/default/seed0/rollouts").iterdir())
    assert chunks == ["step000000.jsonl.gz", "step000001.jsonl.gz"]  # the trimmed config keeps every step
    assert "Rollout samples: what training changed" in (out / "samples.html").read_text()
    claims = (out / "claims.md").read_text()
    assert all(f"\n## {n}. " in claims for n in range(1, 6)), claims[:2000]
    assert "<h1>Headline claims of QeRL" in (out / "claims.html").read_text()


def _report_results(report: Path) -> dict:
    """The report's embedded file records ({path: {name, mime_type, data_uri, labels, ...}})."""
    text = report.read_text()
    found = re.search(r'<script id="results">\s*var results = (\{.*?\});?\s*</script>', text, re.S)
    assert found, "no results record in the report"
    return json.loads(found.group(1))


@pytest.mark.slow
def test_report_embeds_every_table_and_the_claims_as_html(trimmed_dag):
    results = _report_results(trimmed_dag["report"])
    by_name = {r["name"]: r for r in results.values()}
    for name in [a for a in ARTIFACTS if a.startswith("table")] + ["claims"]:
        page = by_name[f"{name}.html"]
        assert page["mime_type"] == "text/html", page["mime_type"]  # displayed in the report, not a download
        html = base64.b64decode(page["data_uri"].split(",", 1)[1]).decode()
        assert "<table>" in html and "<td" in html, name
    assert by_name["samples.html"]["mime_type"] == "text/html"  # the samples page, displayed too
    for ext in ("md", "tex", "csv"):  # the downloads stay beside it
        assert f"table1.{ext}" in by_name
    assert by_name["table1.html"]["labels"] == {"table": ARTIFACTS["table1"].title, "file": "HTML, shown here"}


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (headless) for the screenshot")
def test_report_table_page_shows_a_table_in_a_browser(trimmed_dag, tmp_path):
    """Open the report in headless Chromium on Table 1's HTML page, as a reviewer clicking it sees it, and check the
    screenshot: our columns' cell colour must cover a real area (a .md attachment would show nothing). Set
    QERL_REPORT_SCREENSHOT=FILE.png to keep the screenshot."""
    from PIL import Image

    text = trimmed_dag["report"].read_text()
    opener = ("<script>window.addEventListener('load', function () { setTimeout(function () {"
              " const key = Object.keys(results).find(k => results[k].name === 'table1.html');"
              " app.setView({navbarMode: 'subcategory', category: 'Tables', subcategory: 'Accuracy',"
              " content: 'html', contentPath: results[key].data_uri, resultPath: key}); }, 300); });</script>")
    view = tmp_path / "report_table1.html"
    end = text.rfind("</body>")  # the page's own; the embedded scripts' sources hold that string too
    view.write_text(text[:end] + opener + text[end:])
    shot = Path(os.environ.get("QERL_REPORT_SCREENSHOT", tmp_path / "report_table1.png"))
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1600,1000",
                           "--virtual-time-budget=10000", f"--screenshot={shot}", view.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    pixels = Counter({color: n for n, color in Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 24)})
    area = 1600 * 1000
    ours_cells, ours_header = (0xEA, 0xF2, 0xFC), (0xC9, 0xDC, 0xF3)  # td.ours / th.ours of qerl.report.tables
    assert pixels[ours_cells] > 0.02 * area and pixels[ours_header] > 0.001 * area, pixels.most_common(5)


@pytest.mark.slow
def test_resume_without_weights_reruns_only_the_unfinished_jobs(trimmed_dag, repo_root, tmp_path, trimmed_config,
                                                                job_server):
    """workflow/resume.sh on a copy of the finished DAG whose models and quantized checkpoints are gone (as packed by
    workflow/run_device.sh, without weights) and one run of a grouped training job unfinished: the models are
    rebuilt, the rest marked current, and then only that run trains, in a job of its own; the group's finished runs
    (QeRL's ablation variants) and every evaluation are left as they were."""
    shutil.copytree(trimmed_dag["results"], tmp_path / "results" / "tiny")
    config = tmp_path / "trimmed.yaml"
    config.write_text(yaml.safe_dump(_config(trimmed_config, tmp_path / "results")))
    out = tmp_path / "results" / "tiny"
    shutil.rmtree(out / "models")
    shutil.rmtree(out / "quantized")
    group = out / "runs/tiny_grpo/tiny/qerl"
    unfinished = group / "default/seed0"
    finished = {p: p.read_bytes() for p in group.glob("*/seed0/eval.json") if p.parent != unfinished}
    assert len(finished) >= 2, sorted(finished)  # the group holds more runs than the unfinished one
    (unfinished / "eval.json").unlink()
    shutil.rmtree(unfinished / "adapter", ignore_errors=True)
    for ckpt in unfinished.glob("checkpoint*"):  # as on a new machine: no checkpoint to resume from
        ckpt.unlink()
    where = ["-s", str(repo_root / "Snakefile"), "-d", str(tmp_path), "--max-threads", "1"]
    proc = subprocess.run(["bash", str(repo_root / "workflow" / "resume.sh"), str(config), *where],
                          capture_output=True, text=True, timeout=900,
                          env={**job_server, "PATH": f"{_BIN}{os.pathsep}{ENV['PATH']}"})
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert (out / "models/tiny/base").is_dir() and (out / "quantized/tiny/nvfp4").is_dir()
    step3 = log.split("resume.sh: step 3", 1)[1].split("resume.sh: step 4", 1)[0]
    ran = re.findall(r"^(?:local)?rule (\w+):", step3, re.M)
    trains = [r for r in ran if r.startswith("train")]
    assert trains == ["train"], " ".join(ran)  # one job of the per-run rule, not the group's
    assert (unfinished / "eval.json").exists()
    assert all(p.read_bytes() == data for p, data in finished.items())
    assert not set(ran) & {"pretrain_tiny", "calibrate", "quantize", "evaluate", "gen_tiny"}, " ".join(ran)
    plan = snakemake([*where, "--cores", "1", "--configfile", str(config), "-n"], timeout=600, env=job_server)
    assert plan.returncode == 0 and "Nothing to be done" in plan.stdout + plan.stderr, (plan.stdout + plan.stderr)[-3000:]


@pytest.mark.slow
def test_rerun_incomplete_after_kill_in_evaluation_keeps_metrics(trimmed_dag, repo_root, tmp_path, trimmed_config,
                                                                 job_server):
    """No metrics are lost when Snakemake reruns a training job that was killed.

    A DAG killed while a training job evaluates leaves its outputs flagged incomplete; `snakemake --rerun-incomplete`
    (both shipped profiles set it) deletes them, metrics.jsonl included, but not checkpoint.pt, which is deliberately
    not an output. The rerun job resumes from that checkpoint and must still end with every step's metrics line.
    The kill is a real SIGKILL of snakemake and of the job, placed at the in-job evaluation (tests/kill_in.py), in
    the grouped job of the LoRA runs of a copy of the finished DAG whose first run's files are removed (so it trains
    from step 0 again; the group's other run, finished, resumes at its last step). The CLI-level kill (`qerl train`
    killed in a step, metrics.jsonl deleted) is tests/rl/test_trainer.py's."""
    shutil.copytree(trimmed_dag["results"], tmp_path / "results" / "tiny")
    cfg = _config(trimmed_config, tmp_path / "results")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    group = tmp_path / "results/tiny/runs/tiny_grpo/tiny/lora"
    run = group / "default/seed0"  # the group's first run (resources.train.group_runs: default, aqn-exponential)
    assert (group / "aqn-exponential/seed0/eval.json").exists()  # a second, finished run in the same job
    for name in ("metrics.jsonl", "eval.json", "checkpoint.pt"):
        (run / name).unlink()
    # -d: Snakemake's own state (.snakemake/, its incomplete markers) stays in tmp_path, not in the checkout
    command = [str(run / "eval.json"), "-s", str(repo_root / "Snakefile"), "-d", str(tmp_path),
               "--cores", "1", "--configfile", str(config)]
    # First run: the training job's `qerl train` kills snakemake, then itself, when it starts its evaluation.
    bin_dir, pidfile = tmp_path / "bin", tmp_path / "snakemake.pid"
    bin_dir.mkdir()
    (bin_dir / "qerl").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = train ]; then exec "{sys.executable}" "{repo_root / "tests" / "kill_in.py"}" '
        f'qerl.evaluate.run:evaluate_model 0 "{pidfile}" "$@"; fi\n'
        f'exec "{sys.executable}" -m qerl.cli "$@"\n')
    (bin_dir / "qerl").chmod(0o755)
    # the killed `qerl train` is tests/kill_in.py in a process of its own; the rerun's goes to the job server
    env = {**job_server, "PATH": f"{_BIN}{os.pathsep}{ENV['PATH']}"}
    first = subprocess.run(["/bin/sh", "-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), SNAKEMAKE, *command],
                           capture_output=True, text=True, timeout=600,
                           env={**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"})
    assert first.returncode == -signal.SIGKILL, (first.stdout + first.stderr)[-3000:]
    ran = re.findall(r"^(?:local)?rule (\w+):", first.stdout + first.stderr, re.M)
    assert ran == ["train_tiny_grpo_lora"], ran  # nothing else of the copied DAG ran again
    written = (run / "metrics.jsonl").read_text()
    assert len(written.splitlines()) == 2 and not (run / "eval.json").exists()
    # The killed snakemake left its lock, and the job's outputs flagged incomplete: a plain rerun refuses.
    unlock = snakemake(command + ["--unlock"], timeout=600, env=env)
    assert unlock.returncode == 0, (unlock.stdout + unlock.stderr)[-3000:]
    plain = snakemake(command, timeout=600, env=env)
    assert plain.returncode != 0 and "--rerun-incomplete" in plain.stdout + plain.stderr
    # As the profiles run it: Snakemake deletes the incomplete metrics.jsonl and reruns the job.
    second = snakemake(command + ["--rerun-incomplete"], timeout=600, env=env)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert (run / "metrics.jsonl").read_text() == written  # the whole history, byte for byte
    assert (run / "eval.json").exists()
    # the job of all lora runs (resources.train.group_runs: default and the beyond-the-paper aqn-exponential)
    log = (tmp_path / "results/tiny/logs/train/tiny_grpo/tiny/lora/all-runs.log").read_text()
    assert f"resumed from {run / 'checkpoint.pt'} at step 2 of 2" in log  # this run's checkpoint, not the other's
