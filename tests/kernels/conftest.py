"""Kernel tests: without a GPU, run the Triton kernels in Triton's CPU interpreter.

TRITON_INTERPRET must be set before `kernels` is imported (triton.jit reads it when the kernels are defined), so it
is set here, before the test modules of this folder import anything. With a GPU the compiled kernels run instead.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
