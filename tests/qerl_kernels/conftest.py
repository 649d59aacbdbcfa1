"""Shared by the kernels' offline build tests (gluon_compile, fp4_gemv, decode_compile): run a build module in a
fresh process without TRITON_INTERPRET (the interpreter, once it has run a kernel in a process, leaves
triton.language patched for itself and a real compile then fails), skipped where this Triton has no CUDA backend
or ptxas."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture()
def offline_build():
    """build(module, *args) -> (CompletedProcess, [row, ...]): `python -m module --json *args` for sm_90 on the CPU
    machine, its JSON rows parsed (one object per line starting with "{")."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        assert get_ptxas(90).path
    except Exception as e:  # noqa: BLE001 - a Triton without its CUDA backend or ptxas
        pytest.skip(f"no CUDA backend / ptxas in this Triton: {e}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}

    def build(module: str, *args: str):
        r = subprocess.run([sys.executable, "-m", module, "--json", *args], capture_output=True, text=True, env=env,
                           timeout=300, cwd=Path(__file__).resolve().parents[2])
        return r, [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    return build
