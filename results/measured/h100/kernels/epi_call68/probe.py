"""Issue 22, call 68: the row-block grid's LoRA epilogue on the 7B o and down launches at M = 1 (LoRA rank 32 and the
residual, as the engine calls them): PRE 0 (`_gl_out`'s loop, every warp all ranks, R / 4 dependent load rounds),
1 (the ranks split over the warps, loaded before the row block's main loop) and 2 (the same after it), beside the
same launch without LoRA / residual and the default path with them, every row timed twice (the order reversed the
second time). Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import fp4_launch, fp4_mma, nvfp4
from qerl_kernels.bench import _clone_prepared, copies_for, read_ceiling, time_calls
from qerl_kernels.reference import nvfp4_quantize_reference

L2 = torch.cuda.get_device_properties(0).L2_cache_size
ceil, _ = read_ceiling()
print(f"read ceiling {ceil:.0f} GB/s", flush=True)
R = 32
for n, k in ((3584, 3584), (3584, 18944), (4608, 3584)):
    p = nvfp4.prepare(*nvfp4_quantize_reference(torch.randn(n, k, device="cuda") * 0.02))
    cp = [p] + [_clone_prepared(q) for q in [p] * (copies_for(p.nbytes, L2) - 1)]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=g)
    t = torch.randn(1, R, device="cuda", dtype=torch.bfloat16, generator=g)
    lb = 0.02 * torch.randn(n, R, device="cuda", dtype=torch.bfloat16, generator=g)
    res = torch.randn(1, n, device="cuda", dtype=torch.bfloat16, generator=g)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    knobs = fp4_mma.MEASURED_WINS[("h100", 0, "bf16", n, k, 1)]
    qkv = n == 4608
    epi = dict(bias=bias) if qkv else dict(lora=(t, lb), residual=res)
    base = fp4_launch.fp4_gemm(x, p, **({"bias": bias} if qkv else dict(lora=(t, lb), residual=res))).float()
    rows = [("default path + epilogue", None, True), ("table knobs, no epilogue", dict(knobs), False)]
    rows += [(f"table knobs + epilogue PRE={pre}", dict(knobs, PRE=pre), True) for pre in ((0,) if qkv else (0, 1, 2))]
    for rep, order in enumerate((rows, rows[::-1])):
        for name, cfg, with_epi in order:
            kw = epi if with_epi else {}
            if cfg is None:
                f = lambda q: fp4_launch.fp4_gemm(x, q, **kw)  # noqa: E731
            else:
                f = lambda q, c=cfg: fp4_mma.fp4_gemm_mma(x, q, **kw, config=c)  # noqa: E731
            try:
                err = ""
                if rep == 0 and with_epi:
                    d = (f(p).float() - base).abs().max().item()
                    err = f" max|diff| vs default {d:.2e} (|y| max {base.abs().max().item():.1f})"
                t_s, _ = time_calls([lambda q=q: f(q) for q in cp])
                print(f"{n}x{k} M=1 pass {rep} {name}: {t_s * 1e3:.2f} us "
                      f"({100 * p.nbytes / t_s / 1e6 / ceil:.0f} %){err}", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing variant must not end the probe
                print(f"{n}x{k} M=1 pass {rep} {name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
    del cp
    torch.cuda.empty_cache()
