"""The samples page (qerl/report/samples.py): completions at the first and last kept step per method, escaped and
cut, and every reward figure's runs linked to their rollout folders."""
from __future__ import annotations

from pathlib import Path

from qerl.config import load_config
from qerl.contract.grid import task_methods
from qerl.contract import paths
from qerl.contract.records import RolloutSample
from qerl.report.samples import render_samples, reward_figures, samples_inputs
from qerl.rl.rollout_log import write_chunk

REPO = Path(__file__).resolve().parents[2]


def _sample(step, prompt, sample, text, reward):
    return RolloutSample(step=step, prompt_id=f"tiny/rl/{prompt}", sample=sample, gold="7", completion=text,
                         reward=reward, correct=reward == 1.0, length=12, truncated=False, logprob_mean=-0.5,
                         entropy=0.7, sigma=0.0)


def test_page_shows_first_and_last_step_escaped_and_links_rollouts(tmp_path):
    cfg = load_config(REPO / "config" / "config.yaml", check_data=False)
    cfg["results_dir"] = str(tmp_path)
    R = paths.root_of(cfg)
    run = paths.run_dir(R, "tiny_grpo", "tiny", "qerl", "default", 0)
    for step, reward in ((0, 0.0), (7, 1.0), (15, 1.0)):
        write_chunk(run, step, [_sample(step, p, s, f"<script>alert({step})</script> " + "x" * 400, reward)
                                for p in range(4) for s in range(2)])
    page = render_samples(cfg)
    assert "<script>" not in page and "&lt;script&gt;alert(0)&lt;/script&gt;" in page  # escaped
    assert "alert(15)" in page and "alert(7)" not in page  # the first and the last kept step only
    assert "step 0</b>: mean reward 0.000" in page and "step 15</b>: mean reward 1.000" in page
    prefix = len("<script>alert(0)</script> ")  # each completion is cut to 300 characters: 3 prompts x 2 steps
    assert page.count("x" * (300 - prefix - 1) + " [...]") == 6 and "x" * (301 - prefix) not in page
    assert 'href="runs/tiny_grpo/tiny/qerl/default/seed0/rollouts/">seed0</a> (3 steps)' in page
    assert "no rollout samples written" in page  # the other runs wrote none here
    for artifact in reward_figures():
        assert artifact.title in page
    assert {a.id for a in reward_figures()} >= {"fig4", "fig7", "fig8", "fig10"}
    assert "fig5" not in {a.id for a in reward_figures()}  # entropy only


def test_inputs_are_the_runs_metrics(tmp_path):
    cfg = load_config(REPO / "config" / "config.yaml", check_data=False)
    inputs = samples_inputs(cfg)
    assert all(p.endswith("/metrics.jsonl") for p in inputs) and len(inputs) == len(set(inputs))
    for method in task_methods(cfg, "tiny_dapo"):
        assert f"{paths.run_dir('results/tiny', 'tiny_dapo', 'tiny', method, 'default', 0)}/metrics.jsonl" in inputs
