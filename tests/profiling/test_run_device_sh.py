"""qerl/profiling/run_device.sh inside a device call's limit: the profile is cut to the time left (LIMIT_S less what
the script has spent less 30 s) and the archive is written however it ends, so a cut call still returns what it
measured (call 106 lost its archive: a 575 s profile timeout after the wheel install passed the call's 600 s)."""
from __future__ import annotations

import os
import subprocess
import tarfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "qerl" / "profiling" / "run_device.sh"

# stand-ins: `python3 -m qerl.cli profile` writes a row and then hangs (a profile running past the limit); every
# other python3 call (the version print, the jsonschema check) succeeds; nvidia-smi prints a GPU
FAKE_PY = """#!/bin/bash
case "$*" in
  *qerl.cli\\ profile*) out=""; prev=""; for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
                        echo "model,batch" > "$out/rollout.csv"; echo "32B,1" >> "$out/rollout.csv"
                        echo '{"tokens_per_s": "1"}'; exec sleep 300 ;;
  *) exit 0 ;;
esac
"""


def test_the_profile_is_cut_to_the_calls_limit_and_archived(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    smi = "#!/bin/bash\necho 'NVIDIA H100 80GB HBM3, 580, 81559 MiB'\n"
    for name, text in {"python3": FAKE_PY, "nvidia-smi": smi}.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "OUT": str(out), "W": str(work), "LIMIT_S": "36"}
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(SCRIPT), "--methods", "qerl"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    took = time.monotonic() - t0
    assert took < 30, f"the profile ran past the call's limit ({took:.0f} s)"
    assert "profile cut to" in res.stdout
    with tarfile.open(out / "profile.tgz") as tar:
        rows = tar.extractfile("./prof/rollout.csv").read().decode()
    assert rows.splitlines() == ["model,batch", "32B,1"]  # what was measured before the cut came back
