"""qerl.readout: one line per printed step in a log (not a TTY), every `every`-th step and the last, with the mean
seconds per step since the previous line; nothing when disabled."""
import io
import re

from qerl.readout import Readout


def test_line_mode_prints_every_nth_and_the_last_step():
    out = io.StringIO()
    r = Readout(total=5, start=1, desc="run/seed0", stream=out, every=2)
    r.note("resumed from step 1")
    for reward in (0.5, 0.25, 0.125, 0.0):
        r.step(reward=reward, kl=0.001234)
    r.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "run/seed0: resumed from step 1"
    assert [line.split(" s/step")[0].rsplit(" ", 1)[0] for line in lines[1:]] == [
        "run/seed0 step 2/5 reward 0.500 kl 0.00123",
        "run/seed0 step 4/5 reward 0.125 kl 0.00123",
        "run/seed0 step 5/5 reward 0.000 kl 0.00123"]
    assert all(re.search(r" \d+\.\d\d s/step$", line) for line in lines[1:])


def test_disabled_prints_nothing():
    out = io.StringIO()
    r = Readout(total=3, stream=out, enabled=False)
    r.note("x")
    r.step(reward=1.0)
    assert out.getvalue() == "" and r.done == 1
