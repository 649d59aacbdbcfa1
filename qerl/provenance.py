"""Provenance: which config, commit and hardware made an output, stamped by the stages and read back by the report.

Two uses, one module:
- every stage stamps its outputs: `provenance(config_path)` (commit, date, command line, Python, hardware, config
  file's sha256), e.g. `json.dump({"result": ..., "provenance": provenance(config_path)}, f)`;
- every rendered artifact says where it came from (results/<scale>/tables/table1.md must name the config, code and
  machine without opening the DAG): `Provenance` collects the stamps of the files an artifact read and writes its
  header line (scale, model, seeds, commit, hardware), falling back to this machine (`host_hardware`) when the inputs
  carry none.

Commit: `git rev-parse HEAD` (with `-dirty`), or the short hash for headers; "unknown" outside a git checkout. A copy
of a checkout whose git metadata is not its own (workflow/run_device.sh on a lent GPU machine, where the metadata
travelled older than the files: runs 9, 14 and the paper-scale runs stamped an older commit) names its commit in the
environment variable QERL_COMMIT, which then wins.
Hardware for a header is the GPU name through torch when an NVIDIA driver is loaded (torch is imported only then, so
rendering on a CPU stays fast), else the CPU model from /proc/cpuinfo or `platform`.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["git_commit", "hardware", "host_hardware", "provenance", "Provenance"]

_REPO = Path(__file__).resolve().parents[1]
_HW_KEYS = ("hardware", "gpu", "device", "cpu")


def git_commit(repo: str | Path = _REPO, short: bool = False) -> str:
    """`<sha>` of HEAD, with `-dirty` when tracked files differ from it; "unknown" outside a git checkout.

    With `short`, the short hash alone (`git rev-parse --short HEAD`, no dirty check), as artifact headers print it.
    QERL_COMMIT, when set, is returned as it is (short: its first 7 characters).
    """
    named = os.environ.get("QERL_COMMIT", "").strip()
    if named:
        return named[:7] if short else named
    if short:
        try:
            out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_hardware() -> str:
    """One line for a header: "GPU <name>" (through torch, only when an NVIDIA driver is present) or "CPU <model>"."""
    if Path("/proc/driver/nvidia").exists():
        try:
            import torch

            if torch.cuda.is_available():
                return f"GPU {torch.cuda.get_device_name(0)}"
        except Exception:  # noqa: BLE001 -- any torch/driver trouble: fall back to the CPU name
            pass
    return f"CPU {_cpu_name() or 'unknown'}"


def hardware() -> dict:
    """CPU model and core count, and the GPU name, driver-visible CUDA version and count when torch sees one."""
    info = {"cpu": _cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover
        pass
    return info


def provenance(config_path: str | Path | None = None) -> dict:
    """Commit, time, command line, hardware and (if given) the config file's path and sha256."""
    out = {
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "python": platform.python_version(),
        "hardware": hardware(),
    }
    if config_path is not None:
        data = Path(config_path).read_bytes()
        out["config"] = {"path": str(config_path), "sha256": hashlib.sha256(data).hexdigest()}
    return out


@dataclass
class Provenance:
    """Collects the provenance of one artifact's inputs while it is rendered.

    Attributes:
        scale, model: from the config.
        seeds: the seeds of the runs and evaluations read so far (empty: none, e.g. a table of committed GPU
            measurements, whose models are in its rows).
        commits, hardware: distinct values seen in the inputs' provenance mappings.
        sources: notes such as "measured on H100 (results/measured/h100)".
    """

    scale: str
    model: str
    seeds: list[int]
    commits: set[str] = field(default_factory=set)
    hardware: set[str] = field(default_factory=set)
    sources: list[str] = field(default_factory=list)

    def add(self, prov: dict) -> None:
        """Record one input file's provenance mapping (keys "commit" and "hardware"/"gpu"/"device"/"cpu"; a
        "hardware" mapping as `provenance` writes it gives its GPU, else its CPU)."""
        if prov.get("commit"):
            commit = str(prov["commit"])
            self.commits.add(commit[:7] + ("-dirty" if commit.endswith("-dirty") else ""))
        for key in _HW_KEYS:
            value = prov.get(key)
            if isinstance(value, dict):  # `hardware()`: {"cpu": ..., "gpu": ... (when torch sees one)}
                value = f"GPU {value['gpu']}" if value.get("gpu") else (f"CPU {value['cpu']}" if value.get("cpu")
                                                                         else None)
            if value:
                self.hardware.add(str(value))
                break

    def fields(self) -> dict[str, str]:
        """The header fields, in order: scale, model, seeds, commit, hardware (and sources when any)."""
        commit = git_commit(short=True)
        runs = sorted(c for c in self.commits if not c.startswith(commit[:7]))
        if runs:
            commit = f"{commit} (inputs from {', '.join(runs)})"
        hardware = "; ".join(sorted(self.hardware)) if self.hardware else f"{host_hardware()} (rendering host)"
        if self.seeds:
            model, seeds = self.model, ", ".join(map(str, self.seeds))
        else:  # measured files (or the config alone): no run of this scale's model, no seed
            model, seeds = "per row (measured files)" if self.sources else "n/a (no run read)", "none (no run read)"
        out = {"scale": self.scale, "model": model, "seeds": seeds, "commit": commit, "hardware": hardware}
        if self.sources:
            out["sources"] = "; ".join(self.sources)
        return out

    def line(self) -> str:
        """One line: "scale: tiny | model: tiny | seeds: 0, 1, 2 | commit: abc1234 | hardware: CPU ..."."""
        return " | ".join(f"{k}: {v}" for k, v in self.fields().items())
