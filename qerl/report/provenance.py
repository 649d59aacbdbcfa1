"""What every rendered artifact says about where it came from: scale, model, seeds, commit, hardware.

Why: a reviewer reading results/<scale>/tables/table1.md must see which config, code and machine produced the numbers
without opening the DAG. The header is built from the config, from the `provenance` mappings of the files the
artifact read (commit and hardware of the runs, when the training and evaluation stages record them) and, as a
fallback, from the machine doing the rendering.

How: `git rev-parse --short HEAD` in the repository (or "unknown"); hardware is the GPU name through torch when an
NVIDIA driver is loaded (torch is imported only then, so rendering on a CPU stays fast), else the CPU model from
/proc/cpuinfo or `platform`.
"""
from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Provenance", "git_commit", "host_hardware"]

_REPO = Path(__file__).resolve().parents[2]
_HW_KEYS = ("hardware", "gpu", "device", "cpu")


def git_commit(repo: str | Path = _REPO) -> str:
    """Short commit hash of `repo` (`git rev-parse --short HEAD`), or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def host_hardware() -> str:
    """GPU name (through torch, only when an NVIDIA driver is present) or CPU model of this machine."""
    if Path("/proc/driver/nvidia").exists():
        try:
            import torch

            if torch.cuda.is_available():
                return f"GPU {torch.cuda.get_device_name(0)}"
        except Exception:  # noqa: BLE001 -- any torch/driver trouble: fall back to the CPU name
            pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return f"CPU {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"CPU {platform.processor() or platform.machine() or 'unknown'}"


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
        "hardware" mapping as qerl/provenance.py writes it gives its GPU, else its CPU)."""
        if prov.get("commit"):
            commit = str(prov["commit"])
            self.commits.add(commit[:7] + ("-dirty" if commit.endswith("-dirty") else ""))
        for key in _HW_KEYS:
            value = prov.get(key)
            if isinstance(value, dict):  # qerl/provenance.py: {"cpu": ..., "gpu": ... (when torch sees one)}
                value = f"GPU {value['gpu']}" if value.get("gpu") else (f"CPU {value['cpu']}" if value.get("cpu")
                                                                         else None)
            if value:
                self.hardware.add(str(value))
                break

    def fields(self) -> dict[str, str]:
        """The header fields, in order: scale, model, seeds, commit, hardware (and sources when any)."""
        commit = git_commit()
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
