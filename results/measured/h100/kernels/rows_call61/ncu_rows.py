"""Issue 22, call 61: one launch each, between cudaProfilerStart/Stop (for ncu --profile-from-start off), of the 7B
gate/up group at M = 1: fp4_mma's row-block grid (KW 4, SPLIT 1, tiled), the same with LOAD_ONLY 2, and the default
path. Run: ncu --profile-from-start off --section ... python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.reference import nvfp4_quantize_reference

p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(37888, 3584, device="cuda") * 0.02))
t = fp4_mma.tile_prepared(p, 1, 2)
x = torch.randn(1, 3584, device="cuda", dtype=torch.bfloat16)
runs = [lambda: fp4_mma.fp4_gemm_mma(x, t, config=dict(GRID="rows", KW=4, SPLIT=1, TILED=True)),
        lambda: fp4_mma.fp4_gemm_mma(x, t, config=dict(GRID="rows", KW=4, SPLIT=1, TILED=True, LOAD_ONLY=2)),
        lambda: fp4_launch.fp4_gemm(x, p)]
for f in runs:  # compile and autotune outside the profiled range
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f in runs:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
