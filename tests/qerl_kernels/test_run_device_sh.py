"""qerl_kernels/run_device.sh's stages (compile_check, gpu_tests) with stand-ins for python3 and nvidia-smi: the
compile log and the GPU tests' log come back in $OUT, a CUDA fault in the tests ends the call before the benchmark,
passing tests go on to it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "qerl_kernels" / "run_device.sh"

# python3 stand-in: the offline compile check prints a failing variant and its verdict; pytest prints $FAKE_PYTEST
# and exits $FAKE_PYTEST_RC; the benchmark says it ran; anything else succeeds
FAKE_PY = """#!/bin/bash
case "$*" in
  "-m qerl_kernels.gluon_compile "*) printf '%s\\n' "| variant | regs |" "gate: ok 240" "down: FAILED spills" \\
                                       "1 of 2 failed";;
  "-m pytest "*) echo "$FAKE_PYTEST"; exit "$FAKE_PYTEST_RC";;
  "-m qerl_kernels.bench "*) echo "bench ran";;
esac
exit 0
"""


@pytest.mark.parametrize("mode", ["wgmma", "wgmma_t", "mma"])
@pytest.mark.parametrize("fault", [True, False])
def test_gpu_tests_stage_ends_the_call_on_a_fault(tmp_path, mode, fault):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in {"python3": FAKE_PY, "nvidia-smi": "#!/bin/bash\necho H100\n"}.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "OUT": str(out), "W": str(tmp_path / "w"),
           "TUNE_S": "0", "FAKE_PYTEST": "RuntimeError: CUDA error: an illegal memory access" if fault else "3 passed",
           "FAKE_PYTEST_RC": "1" if fault else "0"}
    res = subprocess.run(["bash", str(SCRIPT), mode], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    log = (out / f"{mode}-pytest.log").read_text()
    assert ("illegal memory access" in log) == fault and (out / "bench.log").exists()
    if mode != "mma":  # the compile check's failures and verdict shown, its table not
        assert "down: FAILED spills" in res.stdout and "1 of 2 failed" in res.stdout and "| variant" not in res.stdout
        assert (out / f"{mode}-compile.log").exists()
    assert (res.returncode == 1) == fault
    assert ("bench ran" in res.stdout) != fault
    assert ("CUDA fault in the tests: benchmark and sweep not run" in res.stdout) == fault
