"""Compile every FP4 kernel variant (fp4_triton.py) into Triton's on-disk cache ahead of time, in parallel
worker processes, so that later calls (the benchmark, tests, training) only load cached binaries: each autotuning
candidate of fp4_tuning.py for both formats, dtypes and bias variants, the dequantize kernel, the tensor-core
tiles both ways, the decode engine's LoRA + residual variants, and the backward kernel.

Run: `python -m qerl_kernels.bench --prewarm N --prewarm-only` (run_device.sh here and in qerl/profiling);
tune.py calls `prewarm` with its own config list.
"""
from __future__ import annotations

import time

__all__ = ["prewarm"]


def _prewarm_job(job) -> str:
    """Compile one kernel variant into Triton's on-disk cache (runs in a worker process)."""
    import torch
    from qerl_kernels import fp4_triton
    kind, cfg, sk, bf16, bias = job
    dt = torch.bfloat16 if bf16 else torch.float16
    variant = dict(HAS_LORA=False, R=16, HAS_RES=False)
    if kind in ("gemm_v", "tc_v"):  # the decode engine's o/down variant: LoRA + residual in the epilogue
        variant = dict(HAS_LORA=True, R=32, HAS_RES=True)
        kind, bias = kind[:-2], kind == "tc_v"
    n, k, m = 512, 1024, 3
    words = torch.zeros(n, k // 8, dtype=torch.int32, device="cuda")
    scales = torch.zeros(n, k // 32, dtype=torch.int16 if sk == 0 else torch.uint8, device="cuda")
    osc = torch.ones(2, n, dtype=torch.float32, device="cuda")
    # optional operands as the real calls pass them (pointer dtypes are part of the compiled signature)
    t_t = torch.zeros(m, 96, dtype=dt, device="cuda") if variant["HAS_LORA"] else osc
    lb_t = torch.zeros(n, 32, dtype=dt, device="cuda") if variant["HAS_LORA"] else osc
    res_t = torch.zeros(m, n, dtype=dt, device="cuda") if variant["HAS_RES"] else osc
    if kind == "dequant":
        out = torch.empty(n, k, dtype=dt, device="cuda")
        fp4_triton._fp4_dequant.warmup(words, scales, osc, out, n, k, words.stride(0), scales.stride(0), out.stride(0),
                                       osc.stride(0), grid=(1,), SCALE_KIND=sk, BF16=bf16, USE_ASM=True, BN=64, BK=cfg,
                                       num_warps=4, num_stages=1)
        return f"dequant bk={cfg}"
    if kind == "gemm_t":  # bias stands for ROW_SCALE here
        g = torch.zeros(m, n, dtype=dt, device="cuda")
        o = torch.empty(m, k, dtype=dt, device="cuda")
        ws = torch.empty(1 << 16, dtype=torch.float32, device="cuda")
        cnt = torch.zeros(1 << 10, dtype=torch.int32, device="cuda")
        fp4_triton._fp4_gemm_t.warmup(g, words, scales, osc, o, ws, cnt, m, n, k, n, k, 16, g.stride(0),
                                      words.stride(0), scales.stride(0), o.stride(0), osc.stride(0), grid=(1,),
                                      SCALE_KIND=sk, BF16=bf16, USE_ASM=True, ROW_SCALE=bias, **cfg.kwargs,
                                      num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return f"gemm_t {cfg.kwargs}"
    if kind == "tc":  # bias stands for FORWARD here
        a = torch.zeros(m, k if bias else n, dtype=dt, device="cuda")
        o = torch.empty(m, n if bias else k, dtype=dt, device="cuda")
        fp4_triton._fp4_gemm_tc.warmup(a, words, scales, osc, osc, o, t_t, lb_t, res_t, m, n if bias else k,
                                       k if bias else n, k if bias else n, n if bias else k, 128, a.stride(0),
                                       words.stride(0), scales.stride(0), o.stride(0), osc.stride(0), t_t.stride(0),
                                       res_t.stride(0), grid=(1,), SCALE_KIND=sk, BF16=bf16, HAS_BIAS=False,
                                       USE_ASM=True, FORWARD=bias, **variant, **cfg.kwargs,
                                       num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return f"tc {cfg.kwargs}"
    x = torch.zeros(m, k, dtype=dt, device="cuda")
    y = torch.empty(m, n, dtype=dt, device="cuda")
    b = torch.zeros(n, dtype=dt, device="cuda") if bias else osc
    ws = torch.empty(1 << 16, dtype=torch.float32, device="cuda")
    cnt = torch.zeros(1 << 10, dtype=torch.int32, device="cuda")
    kw = dict(cfg.kwargs)
    extra = {"maxnreg": cfg.maxnreg} if getattr(cfg, "maxnreg", None) else {}
    fp4_triton._fp4_gemm.warmup(x, words, scales, osc, b, y, ws, cnt, t_t, lb_t, res_t, m, n, k, k, 16,
                                x.stride(0), words.stride(0), scales.stride(0), y.stride(0), osc.stride(0),
                                t_t.stride(0), res_t.stride(0), grid=(1,), SCALE_KIND=sk, BF16=bf16, HAS_BIAS=bias,
                                USE_ASM=True, EVEN_K=True, **variant, **kw,
                                num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra)
    return f"gemm {kw}"


def prewarm(processes: int, bias_variants=(False, True), dtypes=(True, False), configs=None, scale_kinds=(0, 1),
            dequant=True) -> float:
    """Compile every autotuning candidate (or `configs`) in parallel so later calls only load cached binaries."""
    import concurrent.futures as cf
    import multiprocessing as mp
    from qerl_kernels import fp4_tuning
    t = time.time()
    configs = fp4_tuning._gemm_configs() if configs is None else configs
    jobs = [("gemm", c, sk, bf, b) for c in configs for sk in scale_kinds for bf in dtypes for b in bias_variants]
    if dequant:
        jobs += [("dequant", bk, sk, bf, False) for bk in (128, 256) for sk in (0, 1) for bf in (True, False)]
        # backward kernel: bf16 (the training dtype), NVFP4 single weights and groups, MXFP4 single weights
        # tensor-core tiles: bf16, NVFP4 (the rollout and training dtype and format), both directions
        jobs += [("tc", c, 0, True, fwd) for c in fp4_tuning._tc_configs() for fwd in (True, False)
                 if c.kwargs["TC_FWD" if fwd else "TC_BWD"]]
        # the decode engine's GEMM variants (NVFP4, bf16) beyond the plain ones (its q/k/v and gate/up groups): o/down
        # with LoRA + residual in the epilogue
        jobs += [("gemm_v", c, 0, True, None) for c in configs]
        jobs += [("tc_v", c, 0, True, None) for c in fp4_tuning._tc_configs() if c.kwargs["TC_FWD"]]
        jobs += [("gemm_t", c, sk, True, rs) for c in fp4_tuning._gemm_t_configs() for sk, rs in
                 ((0, False), (0, True), (1, False))]
    with cf.ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as ex:
        for fut in cf.as_completed([ex.submit(_prewarm_job, j) for j in jobs]):
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - a config that cannot compile is skipped by the autotuner too
                print(f"prewarm: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return time.time() - t
