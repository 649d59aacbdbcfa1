"""Where the backward wgmma kernel's eager host time goes: cProfile of 300 eager calls of fp4_gemm_t(path="wgmma") on
the 7B o_proj weight at M = 128 (28 us of GPU time a call, so the host sets the pace), and the wall time a call."""
import cProfile
import pstats
import time

import torch

from qerl_kernels import fp4_launch as L
from qerl_kernels import nvfp4
from qerl_kernels.reference import nvfp4_quantize_reference

w = torch.randn(3584, 3584, device="cuda") * 0.02
p = nvfp4.prepare(*nvfp4_quantize_reference(w))
g = torch.randn(128, 3584, device="cuda", dtype=torch.bfloat16)
for path in ("wgmma", "swap"):
    for _ in range(20):
        L.fp4_gemm_t(g, p, path=path)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(300):
        L.fp4_gemm_t(g, p, path=path)
    torch.cuda.synchronize()
    print(f"{path}: {(time.perf_counter() - t0) / 300 * 1e6:.1f} us a call (300 eager calls, wall)", flush=True)
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    L.fp4_gemm_t(g, p, path="wgmma")
torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
