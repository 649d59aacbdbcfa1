"""How the report stage names the files it reads, from the config, and the `Context` a renderer reads them through.

Why: the registry (which runs an artifact needs), the Snakemake rules (its inputs) and the renderers (what they
load) must agree on every path. They all go through the functions here, which read only the config.

The config keys read here belong to other stages (train, evaluate, profile); they are read defensively, with the
defaults below, so a key that is absent or renamed degrades to a default rather than a crash:

- task of a role (grpo / dapo): the first entry of train.tasks ({NAME: {algorithm: grpo, ...}}) with that
  algorithm; without train.tasks: tiny_grpo / tiny_dapo at the tiny scale, gsm8k / bigmath otherwise.
- benchmarks of a role: train.tasks.NAME.eval_benchmarks, else the task's held-out split (source tiny -> [tiny],
  gsm8k -> [gsm8k], math_train -> [math500, aime24, aime25, amc23]).
- untrained formats and their benchmarks: evaluate.methods (bf16, nf4, mxfp4, nvfp4) x the role's benchmarks that
  evaluate.benchmarks lists.
- trained methods: train.methods (default: every trained method of qerl/methods.py); a task's own
  train.tasks.NAME.methods, when it lists any, narrows them for that task's role.
- ablations: train.ablations.method (qerl) and .seeds (default: the config's seeds); the task role is
  train.ablations.task when present (default grpo: the paper's 3B/7B ablations are GSM8K); Fig. 8 needs .noaqn
  (true); Fig. 9/15 .aqn_schedules (linear, exponential, cosine, logarithmic); Fig. 10 and Table 9 .ranks
  (16, 32, 64, 128); Fig. 16/17 .lrs (5e-6, 3e-5) for the methods in .lr_methods (qerl, lora).
- measured GPU folder: profile.measured_gpu, else among the folders of <results_dir>/measured holding a profiling
  CSV (rollout/e2e/memory.csv): one whose name contains h100, else the first in name order.

A role without a task (e.g. no DAPO task configured) makes its artifacts say "not run" instead of naming files.
Variant names: "default"; "noaqn"; "aqn-<schedule>"; "rank<r>"; "lr<value>" with value formatted by `lr_variant`
("%g": 5e-06 -> "lr5e-06", 3e-05 -> "lr3e-05"), which parses back with float() as the trainer does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qerl.data.benchmarks import HELD_OUT
from qerl.methods import TRAINED_METHODS, UNTRAINED_METHODS
from qerl.report import inputs
from qerl.report.paper import ABLATION_RANKS, ABLATION_SCHEDULES, FIG16_LRS
from qerl.report.provenance import Provenance
from qerl.rl.variants import canonical_variant, lr_variant

__all__ = [
    "RunSpec",
    "EvalSpec",
    "Needs",
    "Context",
    "results_root",
    "task_name",
    "role_benchmarks",
    "untrained_benchmarks",
    "run_seeds",
    "trained_methods",
    "untrained_methods",
    "ablation",
    "lr_variant",
    "run_path",
    "eval_path",
    "measured_dir",
    "MEASURED_FILES",
]

MEASURED_FILES = ("rollout.csv", "e2e.csv", "memory.csv")
_DEFAULT_TASKS = {"tiny": {"grpo": "tiny_grpo", "dapo": "tiny_dapo"}}
_PAPER_TASKS = {"grpo": "gsm8k", "dapo": "bigmath"}
_PAPER_BENCHMARKS = {"grpo": ["gsm8k"], "dapo": ["math500", "aime24", "aime25", "amc23"]}


@dataclass(frozen=True)
class RunSpec:
    """One method + variant trained on the task of `role`, over all configured seeds.

    Attributes:
        role: "grpo" (Table 1's task) or "dapo" (Table 2's).
        method: a trained method of qerl/methods.py.
        variant: "default" or an ablation variant.
        file: "metrics.jsonl" (curves) or "eval.json" (accuracy).
        label: legend or row label.
        seeds: the seeds this run exists for (None = the config's seeds; ablations use train.ablations.seeds).
    """

    role: str
    method: str
    variant: str = "default"
    file: str = "metrics.jsonl"
    label: str = ""
    seeds: tuple[int, ...] | None = None


@dataclass(frozen=True)
class EvalSpec:
    """The untrained model in format `method` (bf16, nf4, mxfp4, nvfp4) on the benchmarks of `role`."""

    role: str
    method: str


@dataclass(frozen=True)
class Needs:
    """Everything one artifact reads. `skipped` lists what it would show but the config does not run."""

    runs: tuple[RunSpec, ...] = ()
    evals: tuple[EvalSpec, ...] = ()
    measured: tuple[str, ...] = ()
    config: bool = False
    skipped: tuple[str, ...] = ()


def _section(cfg: dict, name: str) -> dict:
    value = cfg.get(name) or {}
    return value if isinstance(value, dict) else {}


def results_root(cfg: dict) -> Path:
    """R = <results_dir>/<scale>."""
    return Path(cfg["results_dir"]) / cfg["scale"]


def _tasks(cfg: dict) -> dict | None:
    tasks = _section(cfg, "train").get("tasks")
    return tasks if isinstance(tasks, dict) else None


def task_name(cfg: dict, role: str) -> str | None:
    """The task folder of a role: the first train.tasks entry whose algorithm is the role ("grpo" / "dapo").

    Returns:
        The task name, or None when train.tasks defines no task of that algorithm.

    Raises:
        ValueError: for a role other than grpo/dapo.
    """
    if role not in ("grpo", "dapo"):
        raise ValueError(f"unknown task role {role!r}; expected 'grpo' or 'dapo'")
    tasks = _tasks(cfg)
    if tasks is None:
        return _DEFAULT_TASKS.get(cfg["scale"], _PAPER_TASKS)[role]
    for name, task in tasks.items():
        if isinstance(task, dict) and task.get("algorithm") == role:
            return str(name)
    return None


def role_benchmarks(cfg: dict, role: str) -> list[str]:
    """Benchmarks whose pass@1 fills our columns of Table 1 (role grpo) or Table 2 (role dapo)."""
    tasks, name = _tasks(cfg), task_name(cfg, role)
    task = tasks.get(name) if tasks is not None and name is not None else None
    if isinstance(task, dict):
        if task.get("eval_benchmarks"):
            return [str(b) for b in task["eval_benchmarks"]]
        if task.get("source") in HELD_OUT:
            return list(HELD_OUT[task["source"]])
    if cfg["scale"] == "tiny":
        return ["tiny"]
    return list(_PAPER_BENCHMARKS[role])


def untrained_benchmarks(cfg: dict, role: str) -> list[str]:
    """The role's benchmarks that the `evaluate` rule evaluates untrained (evaluate.benchmarks, when listed)."""
    listed = _section(cfg, "evaluate").get("benchmarks")
    benches = role_benchmarks(cfg, role)
    return [b for b in benches if b in listed] if isinstance(listed, list) else benches


def trained_methods(cfg: dict, role: str | None = None) -> list[str]:
    """train.methods, or every trained method; with a role, the methods its task trains (train.tasks.NAME.methods
    when that lists any)."""
    listed = _section(cfg, "train").get("methods")
    methods = [str(m) for m in listed] if isinstance(listed, list) else list(TRAINED_METHODS)
    task = (_tasks(cfg) or {}).get(task_name(cfg, role)) if role is not None else None
    own = task.get("methods") if isinstance(task, dict) else None
    return [m for m in methods if m in own] if isinstance(own, list) and own else methods


def untrained_methods(cfg: dict) -> list[str]:
    """evaluate.methods (untrained formats), or bf16, nf4, mxfp4, nvfp4."""
    listed = _section(cfg, "evaluate").get("methods")
    if isinstance(listed, list):
        return [str(m) for m in listed if m in UNTRAINED_METHODS]
    return list(UNTRAINED_METHODS)


def ablation(cfg: dict, key: str) -> Any:
    """train.ablations.<key>, with defaults: task "grpo", method "qerl", seeds = the config's seeds, noaqn True,
    aqn_schedules / ranks / lrs the paper's, lr_methods [qerl, lora].

    Raises:
        ValueError: for an unknown key.
    """
    defaults = {"task": "grpo", "method": "qerl", "seeds": list(cfg["seeds"]), "noaqn": True,
                "aqn_schedules": list(ABLATION_SCHEDULES), "ranks": list(ABLATION_RANKS), "lrs": list(FIG16_LRS),
                "lr_methods": ["qerl", "lora"], "aqn_methods": ["lora"], "tis_caps": [2.0], "norms": True}
    if key not in defaults:
        raise ValueError(f"unknown ablation key {key!r}; known: {sorted(defaults)}")
    section = _section(cfg, "train").get("ablations")
    value = section.get(key) if isinstance(section, dict) else None
    if key == "task":  # train.ablations.task names a task (null = the first); figures address tasks by role
        tasks = _tasks(cfg) or {}
        name = value if value is not None else next(iter(tasks), None)
        return tasks[name].get("algorithm", "grpo") if name in tasks else defaults["task"]
    return defaults[key] if value is None else value


def run_seeds(cfg: dict, spec: RunSpec) -> list[int]:
    """The seeds a run spec stands for."""
    return list(spec.seeds) if spec.seeds is not None else list(cfg["seeds"])


def run_path(cfg: dict, spec: RunSpec, seed: int) -> Path:
    """R/runs/<task>/<model>/<method>/<variant>/seed<k>/<file>.

    Raises:
        ValueError: when the spec's role has no task in this config.
    """
    task = task_name(cfg, spec.role)
    if task is None:
        raise ValueError(f"config key 'train.tasks' defines no task with algorithm {spec.role!r}")
    variant = canonical_variant(cfg, spec.method, spec.variant) if "train" in cfg else spec.variant
    return (results_root(cfg) / "runs" / task / cfg["model"]["name"] / spec.method / variant
            / f"seed{seed}" / spec.file)


def eval_path(cfg: dict, method: str, benchmark: str, seed: int) -> Path:
    """R/evals/<model>/<method>/<benchmark>/seed<k>.json."""
    return results_root(cfg) / "evals" / cfg["model"]["name"] / method / benchmark / f"seed{seed}.json"


def measured_dir(cfg: dict) -> Path | None:
    """<results_dir>/measured/<gpu>, chosen as the module docstring says; None when there is none."""
    root = Path(cfg["results_dir"]) / "measured"
    chosen = _section(cfg, "profile").get("measured_gpu")
    if chosen:
        return root / str(chosen)
    if not root.is_dir():
        return None
    profiled = ("rollout.csv", "e2e.csv", "memory.csv")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and any((p / n).exists() for n in profiled))
    if not folders:
        return None
    preferred = [p for p in folders if "h100" in p.name.lower()]
    return (preferred or folders)[0]


@dataclass
class Context:
    """What a renderer gets: the config, the artifact's needs, and loaders that record provenance.

    Attributes:
        cfg: the validated config.
        needs: the artifact's inputs for this config.
        allow_missing: a missing run/eval file is skipped (and noted) instead of raising.
        prov: the provenance collected while loading.
        notes: lines the renderer adds to the caption (missing files, methods not run, not measured).
    """

    cfg: dict
    needs: Needs
    allow_missing: bool = False
    prov: Provenance = field(init=False)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.prov = Provenance(self.cfg["scale"], self.cfg["model"]["name"], [])  # seeds: added as files are read
        if self.needs.skipped:
            self.notes.append(f"Not run in this config: {'; '.join(self.needs.skipped)}.")

    def read_seeds(self) -> list[int]:
        """The seeds of the runs and evaluations this artifact reads (none for measured files or the config)."""
        seeds = {s for spec in self.needs.runs for s in run_seeds(self.cfg, spec)}
        return sorted(seeds | (set(self.cfg["seeds"]) if self.needs.evals else set()))

    @property
    def scale(self) -> str:
        return self.cfg["scale"]

    @property
    def model(self) -> str:
        return self.cfg["model"]["name"]

    @property
    def seeds(self) -> list[int]:
        return list(self.cfg["seeds"])

    def ours(self) -> str:
        """Column prefix of our values: "ours (tiny)"."""
        return f"ours ({self.scale})"

    def _exists(self, path: Path) -> bool:
        if path.exists():
            return True
        if not self.allow_missing:
            raise ValueError(f"input file {path} does not exist (run its rule first, or render with --allow-missing)")
        self.notes.append(f"Missing input skipped: {path}.")
        return False

    def _read_seed(self, seed: int) -> None:
        if seed not in self.prov.seeds:
            self.prov.seeds = sorted([*self.prov.seeds, seed])

    def _run_provenance(self, run_dir: Path) -> None:
        """The trainer's run.json beside a run's files carries its provenance (commit, hardware); optional."""
        path = run_dir / "run.json"
        if path.exists():
            self.prov.add(inputs.read_run_provenance(path))

    def metrics(self, spec: RunSpec) -> list[dict[str, list[float]]]:
        """Per-seed metric columns of `spec` (seeds whose file is missing are skipped when allowed)."""
        out = []
        for seed in run_seeds(self.cfg, spec):
            path = run_path(self.cfg, RunSpec(spec.role, spec.method, spec.variant, "metrics.jsonl"), seed)
            if self._exists(path):
                out.append(inputs.read_metrics(path))
                self._run_provenance(path.parent)
                self._read_seed(seed)
        return out

    def run_evals(self, spec: RunSpec, benchmarks: list[str]) -> list[dict[str, inputs.BenchResult]]:
        """Per-seed {benchmark: BenchResult} of a trained run's eval.json.

        Raises:
            ValueError: naming the file when one of `benchmarks` is not in it.
        """
        out = []
        for seed in run_seeds(self.cfg, spec):
            path = run_path(self.cfg, RunSpec(spec.role, spec.method, spec.variant, "eval.json"), seed)
            if self._exists(path):
                results, prov = inputs.read_eval(path)
                absent = [b for b in benchmarks if b not in results]
                if absent:
                    raise ValueError(f"{path}: key(s) {['benchmarks.' + b for b in absent]} missing; "
                                     f"present: {sorted(results)}")
                self.prov.add(prov)
                self._run_provenance(path.parent)
                self._read_seed(seed)
                out.append(results)
        return out

    def untrained_evals(self, method: str, benchmarks: list[str]) -> list[dict[str, inputs.BenchResult]]:
        """Per-seed {benchmark: BenchResult} of the untrained model in format `method`."""
        out = []
        for seed in self.seeds:
            per_seed = {}
            for bench in benchmarks:
                path = eval_path(self.cfg, method, bench, seed)
                if self._exists(path):
                    result, prov = inputs.read_untrained_eval(path, bench)
                    self.prov.add(prov)
                    self._read_seed(seed)
                    per_seed[bench] = result
            if per_seed:
                out.append(per_seed)
        return out

    def measured(self, name: str) -> list[dict] | None:
        """Rows of measured/<gpu>/<name> (rollout.csv, e2e.csv, memory.csv), or None when absent."""
        folder = measured_dir(self.cfg)
        if folder is None or not (folder / name).exists():
            return None
        reader = {"rollout.csv": inputs.read_rollout_csv, "e2e.csv": inputs.read_e2e_csv,
                  "memory.csv": inputs.read_memory_csv}[name]
        rows = reader(folder / name)
        prov = inputs.read_measured_provenance(folder)
        note = f"measured on {prov.get('gpu') or folder.name} ({folder / name})"
        if note not in self.prov.sources:
            self.prov.sources.append(note)
        self.prov.hardware.add(f"GPU {prov.get('gpu') or folder.name} (measured files)")
        return rows

    def measured_label(self) -> str:
        """Column prefix of measured values: "ours (measured, h100)"."""
        folder = measured_dir(self.cfg)
        return f"ours (measured, {folder.name})" if folder is not None else "ours (measured)"

    def measured_where(self, name: str) -> str:
        """Where `name` is expected, for "not measured" captions."""
        folder = measured_dir(self.cfg)
        return str((folder if folder is not None else Path(self.cfg["results_dir"]) / "measured" / "<gpu>") / name)
