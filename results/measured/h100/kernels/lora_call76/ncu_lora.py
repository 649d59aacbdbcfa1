"""Issue 22, call 76: one launch each, between cudaProfilerStart/Stop (for ncu --profile-from-start off), of the norm +
LoRA down-product kernel (qerl_kernels.decode.rmsnorm_lora) on the 7B q/k/v factors (RT 96) at 1 and 8 rows: at 8
rows it takes 26 us against 5 at 1 (call 68), for its stall reasons and hot instructions.
Run: ncu --profile-from-start off --section ... python3 <this file>."""
import torch

from qerl_kernels import decode

runs = []
for rows in (1, 8):
    h = torch.randn(rows, 3584, device="cuda", dtype=torch.bfloat16)
    w = 1 + 0.1 * torch.randn(3584, device="cuda", dtype=torch.bfloat16)
    a = 0.02 * torch.randn(96, 3584, device="cuda", dtype=torch.bfloat16)
    runs.append(lambda h=h, w=w, a=a: decode.rmsnorm_lora(h, w, 1e-6, a, use_triton=True))
for f in runs:  # compile outside the profiled range
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f in runs:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
