"""Live readout of a long job: a progress bar on a terminal, one plain line per step in a log file.

Why: the DAG's jobs write stderr to log files, where a tqdm bar is one ever-growing line of carriage returns (or,
with `--no-progress`, nothing at all until the job ends). `tail -f results/<scale>/logs/train/...log` should show
where a run is: step, reward, entropy and seconds per step. On a terminal the same job shows a tqdm bar.

    with Readout(total=16, start=0, desc="qerl/default/seed0") as out:
        for step in range(16):
            ...
            out.step(reward=0.41, entropy=0.15)     # "qerl/default/seed0 step 1/16 reward 0.410 entropy 0.150 1.2 s/step"
"""
from __future__ import annotations

import sys
import time

__all__ = ["Readout"]


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 and value != 0 else f"{value:.3f}"
    return str(value)


class Readout:
    """Progress of a loop of `total` steps, resumed at `start`.

    Args:
        total: number of steps of the whole run.
        start: steps already done (a resumed run).
        desc: what runs (printed on every line).
        enabled: False prints nothing (non-zero ranks, tests).
        stream: where to write (default sys.stderr); a TTY gets a tqdm bar, anything else one line per step.
        every: print every `every`-th step in line mode (the last step is always printed).
    """

    def __init__(self, total: int, start: int = 0, desc: str = "", *, enabled: bool = True, stream=None,
                 every: int = 1):
        self.total, self.done, self.desc, self.every = total, start, desc, max(1, every)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._bar = None
        self._since, self._since_done = time.perf_counter(), start  # the last printed line (line mode)
        if enabled and getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, desc=desc, unit="step", file=self.stream, mininterval=1.0)

    def note(self, text: str) -> None:
        """One line of text (e.g. "resumed from step 8"), above the bar on a terminal."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(f"{self.desc}: {text}", file=self.stream)
        else:
            print(f"{self.desc}: {text}", file=self.stream, flush=True)

    def step(self, **values) -> None:
        """One step done; `values` (name=number) are shown beside it, with the mean seconds per step since the last
        printed line (`every` steps in line mode)."""
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix({k: _fmt(v) for k, v in values.items()})
            return
        if self.done % self.every and self.done != self.total:
            return
        now = time.perf_counter()
        seconds = (now - self._since) / (self.done - self._since_done)
        self._since, self._since_done = now, self.done
        fields = " ".join(f"{k} {_fmt(v)}" for k, v in values.items())
        print(f"{self.desc} step {self.done}/{self.total} {fields} {seconds:.2f} s/step".replace("  ", " "),
              file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Readout":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
