"""How the report stage names the files it reads, from a validated config, and the `Context` a renderer reads them
through.

Why: the registry (which runs an artifact needs), the Snakemake rules (its inputs) and the renderers (what they
load) must agree on every path, and with the stages that write them. Paths come from the path grammar of
qerl/contract/paths.py (the one the train and evaluate rules and the trainer use), method names and labels from
qerl/contract/methods.py, variant names from qerl/contract/variants.py, file contents from qerl/contract/records.py.
The config is the validated one (qerl.config.load_config: every key present, defaults filled in), so it is read
directly; a config that was not validated is a caller's bug and fails with a KeyError.

- task of a role (grpo / dapo): the first entry of train.tasks with that algorithm (None: the role is not run, and
  its artifacts say "not run" instead of naming files).
- benchmarks of a role: what its task is evaluated on (qerl.contract.paths.task_benchmarks: the task's
  eval_benchmarks, else its source's held-out split); a role without a task shows the benchmarks of its paper table
  (the tiny scale's generated one at the tiny scale) so the untrained rows still have columns.
- untrained formats and their benchmarks: evaluate.methods x the role's benchmarks that evaluate.benchmarks lists.
- trained methods: train.methods; a task's own train.tasks.NAME.methods, when it lists any, narrows them for that
  task's role.
- ablations: train.ablations.*; the task role is the algorithm of train.ablations.task (or of the first task).
- measured GPU folder, chosen per model: the candidate folders are profile.measured_gpu's alone when it is set,
  else the folders of <results_dir>/measured holding a profiling CSV (rollout/e2e/memory.csv), those whose name
  contains h100 first (the paper's GPU), then in name order. A model's numbers come from the first candidate with
  rows for it in any of the three CSVs, all three files from that one folder, so no row (and no speedup) mixes
  GPUs; each row read says its folder in key "gpu". Artifacts spanning models mark the GPU per model when their
  models come from more than one folder (`Context.measured_mixed`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qerl.contract import paths
from qerl.contract.measured import MEASURED_CSVS
from qerl.contract.records import BenchmarkRecord
from qerl.contract.variants import canonical_variant, lr_variant
from qerl.provenance import Provenance
from qerl.report import inputs
from qerl.report.paper import TABLE2_BENCHMARKS

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
    "measured_folders",
    "MEASURED_FILES",
]

MEASURED_FILES = tuple(name for name, spec in MEASURED_CSVS.items() if spec.required)  # the ones the report reads
_READERS = {"rollout.csv": inputs.read_rollout_csv, "e2e.csv": inputs.read_e2e_csv,
            "memory.csv": inputs.read_memory_csv}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)B")
# the benchmarks of a role's paper table, shown when the config runs no task of that role (tiny: the generated one)
_NO_TASK_BENCHMARKS = {"grpo": ["gsm8k"], "dapo": list(TABLE2_BENCHMARKS)}


@dataclass(frozen=True)
class RunSpec:
    """One method + variant trained on the task of `role`, over all configured seeds.

    Attributes:
        role: "grpo" (Table 1's task) or "dapo" (Table 2's).
        method: a trained method of qerl/contract/methods.py.
        variant: "default" or an ablation variant.
        file: "metrics.jsonl" (curves) or "eval.json" (accuracy).
        label: legend or row label.
        seeds: the seeds this run exists for (None = the config's seeds; ablations use train.ablations.seeds).
    """

    role: str
    method: str
    variant: str = "default"
    file: str = paths.METRICS_FILE
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


def results_root(cfg: dict) -> Path:
    """R = <results_dir>/<scale>."""
    return Path(paths.root_of(cfg))


def task_name(cfg: dict, role: str) -> str | None:
    """The task folder of a role: the first train.tasks entry whose algorithm is the role ("grpo" / "dapo").

    Returns:
        The task name, or None when train.tasks defines no task of that algorithm.

    Raises:
        ValueError: for a role other than grpo/dapo.
    """
    if role not in ("grpo", "dapo"):
        raise ValueError(f"unknown task role {role!r}; expected 'grpo' or 'dapo'")
    return next((name for name, task in cfg["train"]["tasks"].items() if task["algorithm"] == role), None)


def role_benchmarks(cfg: dict, role: str) -> list[str]:
    """Benchmarks whose pass@1 fills our columns of Table 1 (role grpo) or Table 2 (role dapo)."""
    name = task_name(cfg, role)
    if name is not None:
        return paths.task_benchmarks(cfg["train"]["tasks"][name])
    return ["tiny"] if cfg["scale"] == "tiny" else list(_NO_TASK_BENCHMARKS[role])


def untrained_benchmarks(cfg: dict, role: str) -> list[str]:
    """The role's benchmarks that the `evaluate` rule evaluates untrained (those evaluate.benchmarks lists)."""
    return [b for b in role_benchmarks(cfg, role) if b in cfg["evaluate"]["benchmarks"]]


def trained_methods(cfg: dict, role: str | None = None) -> list[str]:
    """train.methods; with a role, the methods its task trains (train.tasks.NAME.methods when that lists any)."""
    methods = list(cfg["train"]["methods"])
    name = task_name(cfg, role) if role is not None else None
    own = cfg["train"]["tasks"][name].get("methods") if name is not None else None
    return [m for m in methods if m in own] if own else methods


def untrained_methods(cfg: dict) -> list[str]:
    """evaluate.methods: the untrained formats evaluated."""
    return list(cfg["evaluate"]["methods"])


def ablation(cfg: dict, key: str) -> Any:
    """train.ablations.<key>; for "task", the role (algorithm) of the ablation task (train.ablations.task, or the
    first of train.tasks), since figures address tasks by role.

    Raises:
        ValueError: for an unknown key.
    """
    section = cfg["train"]["ablations"]
    if key not in section:
        raise ValueError(f"unknown ablation key {key!r}; known: {sorted(section)}")
    if key == "task":
        tasks = cfg["train"]["tasks"]
        return tasks[section["task"] or next(iter(tasks))]["algorithm"]
    return section[key]


def run_seeds(cfg: dict, spec: RunSpec) -> list[int]:
    """The seeds a run spec stands for."""
    return list(spec.seeds) if spec.seeds is not None else list(cfg["seeds"])


def run_path(cfg: dict, spec: RunSpec, seed: int) -> Path:
    """R/runs/<task>/<model>/<method>/<variant>/seed<k>/<file> (the variant in its canonical name).

    Raises:
        ValueError: when the spec's role has no task in this config.
    """
    task = task_name(cfg, spec.role)
    if task is None:
        raise ValueError(f"config key 'train.tasks' defines no task with algorithm {spec.role!r}")
    variant = canonical_variant(cfg, spec.method, spec.variant)
    run = paths.run_dir(paths.root_of(cfg), task, cfg["model"]["name"], spec.method, variant, seed)
    return Path(run) / spec.file


def eval_path(cfg: dict, method: str, benchmark: str, seed: int) -> Path:
    """R/evals/<model>/<method>/<benchmark>/seed<k>.json."""
    return Path(paths.eval_file(paths.root_of(cfg), cfg["model"]["name"], method, benchmark, seed))


def measured_folders(cfg: dict) -> list[Path]:
    """The candidate measured folders, in preference order (the module docstring's rule): [<results_dir>/measured/
    <profile.measured_gpu>] when that key is set (whether or not the folder exists), else the folders holding a
    profiling CSV, h100-named first, then by name; [] when there is none."""
    chosen = cfg["profile"]["measured_gpu"]
    if chosen:
        return [Path(paths.measured_dir(cfg["results_dir"], chosen))]
    root = Path(cfg["results_dir"]) / "measured"
    if not root.is_dir():
        return []
    folders = [p for p in root.iterdir() if p.is_dir() and any((p / n).exists() for n in MEASURED_FILES)]
    return sorted(folders, key=lambda p: ("h100" not in p.name.lower(), p.name))


def _model_order(model: str) -> tuple:
    """Sort key of a measured row's model label: the paper's sizes ascending ("3B" < "14B"), other names after."""
    size = _SIZE.fullmatch(model)
    return (0, float(size.group(1)), model) if size else (1, 0.0, model)


@dataclass
class Context:
    """What a renderer gets: the config, the artifact's needs, and loaders that record provenance.

    Attributes:
        cfg: the validated config.
        needs: the artifact's inputs for this config.
        allow_missing: a missing run/eval file is skipped (and noted) instead of raising.
        prov: the provenance collected while loading.
        notes: lines the renderer adds to the caption (missing files, methods not run, not measured).
        reads: the files parsed so far, by reader and path, so that each is read once; contexts that read the same
            files (the claims document's) share one mapping. The parsed values are read-only.
    """

    cfg: dict
    needs: Needs
    allow_missing: bool = False
    prov: Provenance = field(init=False)
    notes: list[str] = field(default_factory=list)
    reads: dict = field(default_factory=dict)

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

    def _read(self, reader, path: Path, *args):
        """reader(path, *args), parsed once per path (see `reads`)."""
        key = (reader.__name__, path)
        if key not in self.reads:
            self.reads[key] = reader(path, *args)
        return self.reads[key]

    def _read_seed(self, seed: int) -> None:
        if seed not in self.prov.seeds:
            self.prov.seeds = sorted([*self.prov.seeds, seed])

    def _run_provenance(self, run_dir: Path) -> None:
        """The trainer's run.json beside a run's files carries its provenance (commit, hardware); optional."""
        path = run_dir / paths.RUN_INFO_FILE
        if path.exists():
            self.prov.add(self._read(inputs.read_run_provenance, path))

    def metrics(self, spec: RunSpec) -> list[dict[str, list[float]]]:
        """Per-seed metric columns of `spec` (seeds whose file is missing are skipped when allowed)."""
        out = []
        for seed in run_seeds(self.cfg, spec):
            path = run_path(self.cfg, RunSpec(spec.role, spec.method, spec.variant, paths.METRICS_FILE), seed)
            if self._exists(path):
                out.append(self._read(inputs.read_metrics, path))
                self._run_provenance(path.parent)
                self._read_seed(seed)
        return out

    def run_evals(self, spec: RunSpec, benchmarks: list[str]) -> list[dict[str, BenchmarkRecord]]:
        """Per-seed {benchmark: BenchmarkRecord} of a trained run's eval.json.

        Raises:
            ValueError: naming the file when one of `benchmarks` is not in it.
        """
        out = []
        for seed in run_seeds(self.cfg, spec):
            path = run_path(self.cfg, RunSpec(spec.role, spec.method, spec.variant, paths.EVAL_FILE), seed)
            if self._exists(path):
                results, prov = self._read(inputs.read_eval, path)
                absent = [b for b in benchmarks if b not in results]
                if absent:
                    raise ValueError(f"{path}: key(s) {['benchmarks.' + b for b in absent]} missing; "
                                     f"present: {sorted(results)}")
                self.prov.add(prov)
                self._run_provenance(path.parent)
                self._read_seed(seed)
                out.append(results)
        return out

    def untrained_evals(self, method: str, benchmarks: list[str]) -> list[dict[str, BenchmarkRecord]]:
        """Per-seed {benchmark: BenchmarkRecord} of the untrained model in format `method`."""
        out = []
        for seed in self.seeds:
            per_seed = {}
            for bench in benchmarks:
                path = eval_path(self.cfg, method, bench, seed)
                if self._exists(path):
                    result, prov = self._read(inputs.read_untrained_eval, path, bench)
                    self.prov.add(prov)
                    self._read_seed(seed)
                    per_seed[bench] = result
            if per_seed:
                out.append(per_seed)
        return out

    def measured_sources(self) -> dict[str, Path]:
        """{model label: the measured folder its numbers come from} (the module docstring's rule), models in the
        paper's order; {} when no candidate folder has a row. (The files are parsed once, `reads`.)"""
        found: dict[str, Path] = {}
        for folder in measured_folders(self.cfg):
            for name in MEASURED_FILES:
                for row in self._measured_file(folder, name) or []:
                    found.setdefault(row["model"], folder)
        return {m: found[m] for m in sorted(found, key=_model_order)}

    def _measured_file(self, folder: Path, name: str) -> list[dict] | None:
        """The parsed rows of folder/name (read once, see `reads`), or None when the file is absent."""
        path = folder / name
        return self._read(_READERS[name], path) if path.exists() else None

    def measured(self, name: str, model: str | None = None) -> list[dict] | None:
        """Rows of a measured CSV (rollout.csv, e2e.csv, memory.csv): every model's (or `model`'s) rows from its own
        folder, each with key "gpu" (the folder's name), in the paper's model order; provenance is recorded for the
        folders they come from.

        Returns:
            The rows ([] when the file exists but holds none of them), or None when the file is absent: from the
            model's folder, or (a model no folder measured, or none at all) from every candidate folder.
        """
        sources = self.measured_sources()
        wanted = [model] if model is not None else list(sources)
        used = self._folders_of(wanted)
        rows, present = [], False
        for folder in used or measured_folders(self.cfg):
            part = self._measured_file(folder, name)
            if part is None:
                continue
            present = True
            if folder in used:
                self._measured_provenance(folder, name)
                rows += [{**r, "gpu": folder.name} for r in part
                         if r["model"] in wanted and sources[r["model"]] == folder]
        return sorted(rows, key=lambda r: _model_order(r["model"])) if present else None

    def _folders_of(self, models: list[str]) -> list[Path]:
        """The folders the numbers of `models` come from, in preference order."""
        chosen = {f for m, f in self.measured_sources().items() if m in models}
        return [f for f in measured_folders(self.cfg) if f in chosen]

    def _measured_provenance(self, folder: Path, name: str) -> None:
        prov = self._read(inputs.read_measured_provenance, folder)
        gpu = prov.get("gpu") or folder.name
        note = f"measured on {gpu} ({folder / name})"
        if note not in self.prov.sources:
            self.prov.sources.append(note)
        self.prov.hardware.add(f"GPU {gpu} (measured files)")

    def measured_gpu(self, model: str) -> str | None:
        """The name of the folder `model`'s measured numbers come from ("h100"), or None when none has it."""
        folder = self.measured_sources().get(model)
        return folder.name if folder is not None else None

    def measured_mixed(self) -> bool:
        """Whether the measured models come from more than one folder (then artifacts spanning models mark the GPU
        of each)."""
        return len(set(self.measured_sources().values())) > 1

    def measured_model(self, model: str) -> str:
        """A model's label in an artifact spanning models: "7B (h100)" when the GPUs are mixed, else "7B"."""
        gpu = self.measured_gpu(model)
        return f"{model} ({gpu})" if gpu is not None and self.measured_mixed() else model

    def measured_label(self, model: str | None = None) -> str:
        """Column prefix of measured values: "ours (measured, h100)" -- the GPU of `model`, or without a model the
        one GPU of every model; "ours (measured)" when that model has no folder or the models' GPUs differ."""
        if model is not None:
            gpus = {self.measured_gpu(model)} - {None}
        else:
            gpus = {folder.name for folder in self.measured_sources().values()}
        return f"ours (measured, {next(iter(gpus))})" if len(gpus) == 1 else "ours (measured)"

    def measured_where(self, name: str, model: str | None = None) -> str:
        """Where `name` is read (for captions): `model`'s folder, or without a model the folders every model comes
        from; the candidate folders (where it was looked for) when that is none; measured/<gpu>/ without any."""
        models = [model] if model is not None else list(self.measured_sources())
        folders = self._folders_of(models) or measured_folders(self.cfg)
        if not folders:
            return str(Path(self.cfg["results_dir"]) / "measured" / "<gpu>" / name)
        return " and ".join(str(folder / name) for folder in folders)

    def measured_gpus_line(self, name: str | None = None, models: list[str] | None = None) -> str:
        """Which GPU each model's numbers come from, when they come from more than one folder: "7B: h100
        (results/measured/h100/rollout.csv); 3B, 14B, 32B: h200 (results/measured/h200/rollout.csv)" (the folder
        when no file `name` is given); `models` narrows the models; "" when they all come from one folder."""
        sources = self.measured_sources()
        chosen = {m: f for m, f in sources.items() if models is None or m in models}
        if len(set(chosen.values())) < 2:
            return ""
        groups = []
        for folder in measured_folders(self.cfg):
            names = [m for m, f in chosen.items() if f == folder]
            if names:
                groups.append(f"{', '.join(names)}: {folder.name} ({folder / name if name else str(folder) + '/'})")
        return "; ".join(groups)
