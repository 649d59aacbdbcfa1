"""Autotuning of the FP4 kernels (fp4_triton.py): each kernel's candidate configs and why these values
(measured on an H200 with tune.py), their pruning by M bucket, and the autotuned kernels
(`_fp4_gemm_tuned`, `_fp4_gemm_t_tuned`, `_fp4_gemm_tc_tuned`) that fp4_launch.py launches when no config
is forced. `python -m qerl_kernels.bench --prewarm N` compiles every candidate ahead of time.
"""
from __future__ import annotations

from qerl_kernels.fp4_decoder import HAVE_TRITON

if HAVE_TRITON:
    import triton

    from qerl_kernels.fp4_triton import _fp4_gemm, _fp4_gemm_t, _fp4_gemm_tc

    def _gemm_configs():
        """Candidate configs for every M bucket; `_prune` keeps those that fit the call.

        Why these values (measured on an H200 with qerl_kernels/tune.py; 132 SMs, 228 KB shared memory per SM):
        - Decode (STREAM_K, BM = M rounded up to 16/32/64). The kernel is bound by decode instructions and
          latency, not by bytes in flight: one warpgroup per CTA (wgmma m64nBMk16, A = decoded weights from
          registers), 64 rows x 256 columns per step, 3-4 cp.async stages, about 2 resident CTAs per SM (CPS 2)
          was fastest on the large layers (1.6 TB/s of weights); 64 x 128 with 4 CTAs per SM and 128 x 128
          came close. More waves (CPS 4-8) only helped the small layers. For BM 32/64 the activations are
          re-read once per 64-row tile, so 128-row tiles halve that traffic.
        - Tiled (M > 64): compute bound; 128x128 or 128x64 output tiles with 8 warps (two warpgroups), BK 128
          (one storage chunk), 3-4 stages, GROUP_M 8 for L2 reuse of W tiles. Beyond M ~ 512, dequantize +
          cuBLAS is faster (fp4_gemm dispatches there).
        """
        # (BN, BK, warps, stages, CTAs per SM[, register cap]); CPS matches what fits in registers and shared
        # memory (read off the compiled kernels): e.g. BM 16, 64 x 256: 166 registers -> 3 CTAs, capped at 128
        # registers -> 4; BM 64 tiles hold a 64-wide accumulator and x tile, so 1-2 CTAs.
        # Iteration 2 adds register caps that fit one more CTA per SM without spilling in the main loop (read off
        # Triton 3.6 sm_90 builds: 64 x 256 at 168 -> 158 registers, 3 CTAs; 128 x 128 at 168 -> 168, 3 CTAs).
        decode = {
            16: ((64, 256, 4, 4, 2), (64, 256, 4, 4, 3), (64, 256, 4, 3, 3), (64, 256, 4, 4, 4, 128),
                 (128, 128, 4, 4, 2), (64, 128, 4, 3, 4), (64, 256, 4, 3, 3, 168), (128, 128, 4, 3, 3, 168)),
            32: ((64, 256, 4, 4, 2), (128, 128, 4, 4, 2), (64, 128, 4, 3, 3), (128, 256, 8, 3, 1),
                 (64, 256, 4, 3, 3, 168)),
            64: ((128, 128, 4, 3, 2), (64, 128, 4, 4, 2), (128, 128, 8, 3, 1), (64, 256, 4, 3, 1)),
        }
        cfgs = []
        for bm, rows in decode.items():
            for bn, bk, nw, st, cps, *cap in rows:
                cfgs.append(triton.Config(dict(STREAM_K=True, BM=bm, BN=bn, BK=bk, GROUP_M=1, CPS=cps),
                                          num_warps=nw, num_stages=st, maxnreg=cap[0] if cap else None))
        for bn, bm, nw, st in ((128, 128, 8, 3), (128, 64, 8, 4), (64, 128, 4, 4)):
            cfgs.append(triton.Config(dict(STREAM_K=False, BM=bm, BN=bn, BK=128, GROUP_M=8, CPS=1),
                                      num_warps=nw, num_stages=st))
        return cfgs

    def _bucket_bm(m: int) -> int:
        return 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128

    def _prune(configs, named_args, **kwargs):
        m, kw = named_args["M"], named_args["KW"]
        bucket = _bucket_bm(m)
        keep = []
        for c in configs:
            kv = c.kwargs
            if kw % kv["BK"]:
                continue
            if bucket <= 64 and kv["STREAM_K"] and kv["BM"] == bucket:
                keep.append(c)
            elif bucket > 64 and not kv["STREAM_K"]:
                keep.append(c)
        return keep

    def _bench(fn, quantiles):
        return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)

    _fp4_gemm_tuned = triton.autotune(
        configs=_gemm_configs(), key=["M_BUCKET", "N", "K", "SCALE_KIND", "BF16", "HAS_BIAS"],
        prune_configs_by={"early_config_prune": _prune}, do_bench=_bench)(
            triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BK"] == 0})(_fp4_gemm))

    def _gemm_t_configs():
        """Candidates for the transposed (backward) kernel: (BKO, BNR, warps, stages, programs per SM).

        Not yet swept on hardware beyond this list (2026-11 iteration 2); the autotuner picks per shape."""
        cfgs = []
        for bm in (16, 32, 64):
            for bko, bnr, nw, st, sx in ((128, 64, 4, 3, 2), (128, 128, 4, 3, 2), (256, 64, 4, 3, 2),
                                         (128, 64, 4, 4, 4), (128, 64, 8, 3, 2)):
                if bm == 64 and bko == 256:  # spills (Triton 3.6, sm_90: 255 registers + 136-560 bytes of stack)
                    continue
                cfgs.append(triton.Config(dict(BM=bm, BKO=bko, BNR=bnr, SPLIT_X=sx), num_warps=nw, num_stages=st))
        return cfgs

    def _prune_t(configs, named_args, **kwargs):
        bm, kw = _bucket_bm_t(named_args["M"]), named_args["KW"]
        return [c for c in configs if c.kwargs["BM"] == bm and kw % c.kwargs["BKO"] == 0]

    _fp4_gemm_t_tuned = triton.autotune(
        configs=_gemm_t_configs(), key=["M_BUCKET", "N", "K", "SCALE_KIND", "BF16", "ROW_SCALE"],
        prune_configs_by={"early_config_prune": _prune_t}, do_bench=_bench)(_fp4_gemm_t)


    def _tc_configs():
        """Candidates of the tensor-core kernel (FORWARD decides which tile side is the decoded one).

        Why these: the MMA wants 128-row activation tiles and two warpgroups; the decoded operand costs the same per
        weight whatever BM is, so larger BM amortises it (BM 256 needs too many registers for the fp32 accumulator
        beside the decoded tile). The backward decodes [BK, BN] tiles whose columns are storage chunks, so BN is a
        multiple of 128 there (TC_FWD / TC_BWD mark the direction a config serves; the kernel ignores them).
        Not yet swept on hardware: the autotuner picks per shape and M bucket."""
        # (BM, BN, BK, warps, stages, forward?, backward?). Forward BM 64 and BN 256 tiles, and the backward's
        # 64 x 128, fail Triton's shared-layout pass (3.9 on sm_90: "Illegal shared layout" in
        # OptimizeDotOperands; compiled on the CPU machine), so they are left out.
        cfgs = []
        for bm, bn, bk, nw, st, fwd, bwd in ((128, 128, 128, 8, 3, 1, 1), (128, 128, 128, 8, 4, 1, 1),
                                              (128, 64, 128, 4, 3, 1, 0), (128, 64, 128, 4, 4, 1, 0),
                                              (256, 128, 128, 8, 2, 1, 1), (128, 128, 64, 8, 4, 0, 1),
                                              (128, 256, 128, 8, 3, 0, 1), (64, 256, 128, 8, 3, 0, 1)):
            cfgs.append(triton.Config(dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, TC_FWD=fwd, TC_BWD=bwd),
                                      num_warps=nw, num_stages=st))
        return cfgs

    def _prune_tc(configs, named_args, **kwargs):
        fwd = kwargs.get("FORWARD", True)
        return [c for c in configs if c.kwargs["TC_FWD" if fwd else "TC_BWD"]]

    _fp4_gemm_tc_tuned = triton.autotune(
        configs=_tc_configs(), key=["M_BUCKET", "NO", "KR", "SCALE_KIND", "BF16", "HAS_BIAS", "FORWARD"],
        prune_configs_by={"early_config_prune": _prune_tc}, do_bench=_bench)(_fp4_gemm_tc)


def _bucket_bm_t(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64
