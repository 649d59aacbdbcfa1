"""The samples page: what the policies wrote at the first and the last kept step, and where every reward figure's
rollouts are (R/samples.html, in the Snakemake report under "Samples").

Why: a reward curve says how often the answers were right, not what learning changed in them; a reader should see a
few completions per method before and after training, and a reviewer who doubts a curve should find the rollout
files behind it. The page is self-contained HTML (every completion HTML-escaped and cut short); its links to the
rollout folders are relative to R, so they open when samples.html is opened from results/<scale>/.

What it shows, from the runs' rollouts/step<k>.jsonl.gz (qerl/rl/rollout_log.py):
  - per task and method (default variant, the first seed): the first and the last kept step, the mean reward and
    accuracy of the step's kept samples, and one completion (sample 0) of each of the first `per_step` prompts;
  - per reward figure (qerl.report.registry.plotted_metrics): its runs, each seed linked to its rollouts/ folder.

Run: `qerl samples --config results/tiny/config.yaml --out results/tiny/samples.html` (rule `samples`).
"""
from __future__ import annotations

import html
from pathlib import Path

from qerl.contract.grid import task_methods
from qerl.contract import paths
from qerl.contract.methods import get_method
from qerl.contract.records import RolloutSample, read_rollouts
from qerl.report.context import run_path, run_seeds
from qerl.report.registry import ARTIFACTS, plotted_metrics
from qerl.report.tables import html_page

__all__ = ["reward_figures", "samples_inputs", "render_samples"]

_CSS = ("<style>td.sample{white-space:pre-wrap;font-family:monospace;text-align:left;max-width:60em}"
        "th.sample{text-align:left} td{vertical-align:top}</style>")


def reward_figures() -> list:
    """The artifacts that plot the reward, in registry order."""
    return [a for a in ARTIFACTS.values() if "reward" in plotted_metrics(a)]


def _default_runs(cfg: dict) -> list[tuple[str, str, str]]:
    """(task, method, run folder) of each task's methods, default variant, first seed."""
    R, model, seed = paths.root_of(cfg), cfg["model"]["name"], cfg["seeds"][0]
    return [(task, m, paths.run_dir(R, task, model, m, "default", seed))
            for task in cfg["train"]["tasks"] for m in task_methods(cfg, task)]


def _figure_runs(cfg: dict, artifact) -> list[tuple[str, list[Path]]]:
    """(label, run folder per seed) of every run a figure reads."""
    out = []
    for spec in artifact.needs(cfg).runs:
        folders = [run_path(cfg, spec, seed).parent for seed in run_seeds(cfg, spec)]
        run = folders[0].parent  # R/runs/<task>/<model>/<method>/<variant>
        out.append((f"{run.parents[2].name} / {get_method(spec.method).label} / {run.name}", folders))
    return out


def samples_inputs(cfg: dict) -> list[str]:
    """The metrics.jsonl of every run the page reads (written by the job that writes its rollouts)."""
    folders = [run for _, _, run in _default_runs(cfg)]
    folders += [str(f) for a in reward_figures() for _, fs in _figure_runs(cfg, a) for f in fs]
    return list(dict.fromkeys(f"{Path(f)}/{paths.METRICS_FILE}" for f in folders))


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars].rstrip() + " [...]"


def _step_block(step: int, samples: list[RolloutSample], per_step: int, chars: int) -> str:
    esc = html.escape
    reward = sum(s.reward for s in samples) / len(samples)
    accuracy = sum(s.correct for s in samples) / len(samples)
    shown = [s for s in samples if s.sample == 0][:per_step]
    rows = "\n".join(
        f"<tr><td>{esc(s.prompt_id)}</td><td>{esc(s.gold)}</td><td>{s.reward:.2f}</td>"
        f"<td>{'yes' if s.correct else 'no'}</td><td>{s.length}{' (cut)' if s.truncated else ''}</td>"
        f"<td class=\"sample\">{esc(_cut(s.completion, chars))}</td></tr>" for s in shown)
    return (f"<p><b>step {step}</b>: mean reward {reward:.3f}, accuracy {accuracy:.3f} over its {len(samples)} kept "
            f"samples; one completion of each of the first {len(shown)} prompts:</p>\n<table><thead><tr><th>prompt"
            f"</th><th>gold</th><th>reward</th><th>correct</th><th>tokens</th><th class=\"sample\">completion</th></tr>"
            f"</thead>"
            f"<tbody>\n{rows}\n</tbody></table>")


def render_samples(cfg: dict, per_step: int = 3, chars: int = 300) -> str:
    """The samples page of a validated config's runs (module docstring), as HTML.

    Args:
        cfg: the validated config (the runs and where they are).
        per_step: prompts shown per step and method.
        chars: completions are cut to this many characters.
    """
    esc = html.escape
    R = Path(paths.root_of(cfg))
    keep = cfg["train"]["rollout_samples"]
    parts = [f"<h1>Rollout samples: what training changed</h1>\n<p class=\"provenance\">scale: {esc(cfg['scale'])} | "
             f"model: {esc(cfg['model']['name'])} | seed {cfg['seeds'][0]} | kept (train.rollout_samples): every "
             f"{keep['every']} step(s) and the last, {keep['share']:.4g} of each step's prompts</p>"]
    task = None
    for name, method, run in _default_runs(cfg):
        if name != task:
            task = name
            parts.append(f"<h2>Task {esc(name)}</h2>")
        chunks = paths.rollout_chunks(Path(run) / paths.ROLLOUTS_DIR)  # [(step, file)] in step order
        samples = read_rollouts(Path(run) / paths.ROLLOUTS_DIR,
                                steps=[chunks[0][0], chunks[-1][0]]) if chunks else []  # the first and last kept
        parts.append(f"<h3>{esc(get_method(method).label)} <small>({esc(Path(run).relative_to(R).as_posix())})"
                     f"</small></h3>")
        if not samples:
            parts.append("<p>no rollout samples written (train.rollout_samples.every is 0, or the run predates "
                         "them)</p>")
            continue
        steps = sorted({s.step for s in samples})
        for step in dict.fromkeys([steps[0], steps[-1]]):
            parts.append(_step_block(step, [s for s in samples if s.step == step], per_step, chars))
    parts.append("<h2>Reward figures and their rollouts</h2>\n<p>Each seed links to the run's rollouts/ folder "
                 "(step&lt;k&gt;.jsonl.gz, one JSON sample a line; <code>zcat</code> reads them), relative to "
                 f"{esc(str(R))}/.</p>")
    for artifact in reward_figures():
        items = []
        for label, folders in _figure_runs(cfg, artifact):
            links = ", ".join(
                f"<a href=\"{esc((f / paths.ROLLOUTS_DIR).relative_to(R).as_posix())}/\">{esc(f.name)}</a> "
                f"({len(paths.rollout_chunks(f / paths.ROLLOUTS_DIR))} steps)" for f in folders)
            items.append(f"<li>{esc(label)}: {links}</li>")
        parts.append(f"<h3>{esc(artifact.title)}</h3>\n<ul>{''.join(items) or '<li>no runs in this config</li>'}</ul>")
    return html_page("Rollout samples", _CSS + "\n" + "\n".join(parts))
