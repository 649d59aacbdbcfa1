"""Issue 22, call 74: one launch each, between cudaProfilerStart/Stop (for ncu --profile-from-start off), of the 7B
gate/up group (no epilogue) and down (LoRA rank 32 + residual) at M = 1 on the row-block grid with the table's knobs
(fp4_mma.MEASURED_WINS: persistent, register-capped), for their warp stall reasons.
Run: ncu --profile-from-start off --section WarpStateStats --print-details all ... python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, nvfp4
from qerl_kernels.reference import nvfp4_quantize_reference

runs = []
for n, k, lora in ((37888, 3584, False), (3584, 18944, True)):
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    epi = dict(lora=(torch.randn(1, 32, device="cuda", dtype=torch.bfloat16),
                     0.02 * torch.randn(n, 32, device="cuda", dtype=torch.bfloat16)),
               residual=torch.randn(1, n, device="cuda", dtype=torch.bfloat16)) if lora else {}
    runs.append(lambda x=x, p=p, epi=epi: fp4_launch.fp4_gemm(x, p, **epi))
for f in runs:  # compile outside the profiled range
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f in runs:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
