"""Launchers and dispatch of the FP4 (NVFP4 / MXFP4) W4A16 kernels: `fp4_gemm` (y = x @ W^T), `fp4_gemm_t`
(grad_x = grad_y @ W), `fp4_gemm_tc` (the tensor-core tiles) and `fp4_dequantize`. nvfp4.py and mxfp4.py are thin
format front ends over this module and layout.py (the load-time layout); the kernels themselves are in
fp4_triton.py (decoder: fp4_decoder.py; autotuning: fp4_tuning.py).

Dispatch by M (see results/measured/*/kernels.csv):
- Forward: decode shapes (M <= 64) run the swap-AB stream-K kernel; larger M the same kernel with one tile per CTA;
  very large M the standalone dequantize kernel followed by cuBLAS, which wins there (the decode cost is amortised
  over M); between 64 and FUSED_MAX_M the faster of the two is timed once per shape (`_choose_path`,
  `dispatch_table`). A third path, the tensor-core tiles in the natural orientation (`fp4_gemm_tc`), forward and
  backward, is built and tested but joins that timed choice only with QERL_FP4_TC=1: on an H200 it ran 0.31-0.51x
  cuBLAS (one CTA per SM, decode not overlapped with the MMA; results/measured/h200/kernels.notes.md, iteration 3).
  The Gluon wgmma kernel (fp4_wgmma.py: NVFP4, Hopper, M <= WGMMA_MAX_M) is a fourth candidate in that timed choice
  (QERL_FP4_WGMMA=0 leaves it out); LoRA and residual then follow it as a cuBLAS addmm and an add.
- Decode M (M <= 8, every epilogue): `fp4_mma.fp4_gemm_mma` (the decoded pairs as mma.sync A fragments straight
  from registers) where `fp4_mma.selected` says so (a committed measurement, fp4_mma.MEASURED_WINS: H100, issue 22
  calls 60-67, the 7B q/k/v, o, gate/up and down launches at batch 1; or QERL_FP4_MMA=1).
- Skinny M (M <= 16, plain product + bias): `fp4_gemv.fp4_gemm_gemv` (many small split-K CTAs) where a committed
  GPU measurement says it is faster than the stream-K kernel (fp4_gemv.MEASURED_WINS: H100, issue 22 call 5) or
  with QERL_FP4_GEMV=1; the stream-K kernel otherwise.
- Backward input gradient (`fp4_gemm_t`): the transposed kernel up to M = 64; above, the fastest of it (up to
  BWD_FUSED_MAX_M), the Gluon backward wgmma kernel (fp4_wgmma_t.py: NVFP4 single weights, Hopper; QERL_FP4_WGMMA=0
  leaves it out) and dequantize + cuBLAS, timed once per shape (`backward_candidates`, `_choose_path_t`).
The stream-K partial tiles and arrival counters live in a per-device workspace allocated once (`_workspace`).

Numerics: dequantized weights are exact (bit-identical to the float32 reference cast to the MMA dtype, up to the
documented fp16 range limits); products accumulate in fp32 (wgmma); the output is rounded once to x's dtype.
fp16 activations run the fp16 MMA, bf16 activations the bf16 MMA. MXFP4 with fp16 activations flushes blocks
whose scale is below 2**-14 times 2**(d) to zero (d: the largest scale exponent minus 1), as fp16 itself would.

CPU: TRITON_INTERPRET=1 runs the same kernels with a pure-Triton decoder instead of the inline PTX (tests/qerl_kernels),
with small fixed configs instead of autotuning.
"""
from __future__ import annotations

import functools
import os

import torch

from qerl_kernels.fp4_decoder import HAVE_TRITON
from qerl_kernels.layout import PreparedFP4, interpret_mode

if HAVE_TRITON:
    import triton

    from qerl_kernels.fp4_triton import _fp4_dequant, _fp4_gemm, _fp4_gemm_t, _fp4_gemm_tc
    from qerl_kernels.fp4_tuning import _fp4_gemm_t_tuned, _fp4_gemm_tc_tuned, _fp4_gemm_tuned

__all__ = ["fp4_gemm", "fp4_gemm_t", "fp4_gemm_tc", "fp4_dequantize", "dispatch_table", "forward_candidates",
           "FUSED_MAX_M", "BWD_FUSED_MAX_M", "TC_MAX_M", "WGMMA_MAX_M", "dequantize_only_above", "backward_candidates"]

# Dispatch by M (see results/measured/*/kernels.csv): the fused kernel up to FUSED_MIN_TRY, dequantize + cuBLAS
# above FUSED_MAX_M, and in between whichever of the two was faster when first timed for that shape.
FUSED_MIN_TRY = 64
FUSED_MAX_M = int(os.environ.get("QERL_FP4_FUSED_MAX_M", "512"))
# Tests set this to False to run the pure-Triton decoder on a GPU (None: inline PTX unless interpreting).
USE_ASM_OVERRIDE: bool | None = None
MAX_PARTS = 8  # stream-K: most CTAs that share one output tile (bounds the serial reduction)


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _device_index(t: torch.Tensor) -> int:
    """The CUDA device index of `t` (the current device for a tensor on "cuda" without an index)."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


_WORKSPACE: dict = {}


def _workspace(device: torch.device, floats: int, counters: int):
    """Per-device stream-K workspace (fp32 partials) and self-resetting arrival counters (zeroed once)."""
    key = (device.type, device.index)
    ws, cnt = _WORKSPACE.get(key, (None, None))
    if ws is None or ws.numel() < floats:
        ws = torch.empty(max(floats, 1 << 20), dtype=torch.float32, device=device)
    if cnt is None or cnt.numel() < counters:
        cnt = torch.zeros(max(counters, 1 << 16), dtype=torch.int32, device=device)
    _WORKSPACE[key] = (ws, cnt)
    return ws, cnt


def _use_asm(interp: bool) -> bool:
    """The inline-PTX decoder unless interpreting, or what USE_ASM_OVERRIDE says."""
    return (not interp) if USE_ASM_OVERRIDE is None else USE_ASM_OVERRIDE


def _launch(kernel, tuned, grid, args: tuple, meta: dict, config: dict | None) -> None:
    """Run `kernel` with the forced `config` (its num_warps / num_stages split off), or the autotuned `tuned`."""
    if config is None:
        tuned[grid](*args, **meta)
        return
    c = dict(config)
    nw, ns = c.pop("num_warps", 4), c.pop("num_stages", 3)
    kernel[grid(c)](*args, **meta, **c, num_warps=nw, num_stages=ns)


def _check_2d(x: torch.Tensor, w: PreparedFP4, cols: int, op: str, name: str) -> None:
    """x must be [M, cols], float16/bfloat16, on the weight's device; errors name the op and the argument."""
    if x.dim() != 2 or x.shape[1] != cols:
        raise ValueError(f"{op}: expected {name} of shape [M, {cols}], got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{op}: {name} must be float16 or bfloat16, got {x.dtype}")
    if x.device != w.words.device:
        raise ValueError(f"{op}: {name} on {x.device} but the weight on {w.words.device}")


def _skinny_io(x: torch.Tensor, w: PreparedFP4, bias: torch.Tensor | None, max_m: int, op: str):
    """The skinny-M kernels' (fp4_gemv, fp4_mma) inputs checked and made ready: (x contiguous with the 4-byte
    aligned start the int32 view of its activation pairs needs, y [M, N] empty in x's dtype).

    Raises:
        ValueError: x not [M, K] fp16/bf16 on the weight's device, M > max_m, or bias not [N] there.
    """
    _check_2d(x, w, w.k, op, "x")
    m = x.shape[0]
    if m > max_m:
        raise ValueError(f"{op}: M = {m} > {max_m}")
    if bias is not None and (tuple(bias.shape) != (w.n,) or bias.device != x.device):
        raise ValueError(f"{op}: bias {tuple(bias.shape)} on {bias.device} is not [{w.n}] on {x.device}")
    x = x.contiguous()
    if x.storage_offset() % 2:
        x = x.clone()
    return x, torch.empty((m, w.n), dtype=x.dtype, device=x.device)


def fp4_gemm(x: torch.Tensor, w, bias: torch.Tensor | None = None, *, config: dict | None = None,
             fused: bool | None = None, path: str | None = None, lora: tuple | None = None,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) (+ t @ B^T) (+ residual) with fp32 accumulation, output in x's dtype.

    Args:
        x: [M, K] float16/bfloat16, on the weight's device (CUDA, or CPU under TRITON_INTERPRET=1).
        w: the prepared weight (PreparedFP4: a single weight or a `concat_prepared` group).
        bias: optional [N].
        config: force one kernel config (dict of STREAM_K, BM, BN, BK, GROUP_M, CPS, num_warps, num_stages)
            instead of autotuning; the interpreter always uses a small fixed one.
        fused: force the stream-K / tiled swap-AB kernel (True) or dequantize + cuBLAS (False).
        path: force "swap" (that kernel), "tc" (`fp4_gemm_tc`, the tensor-core tiles), "deq" (dequantize +
            cuBLAS), "wgmma" (`fp4_wgmma.fp4_gemm_wgmma`, the Gluon kernel: NVFP4, Hopper, M <= its MAX_M; `config`
            then holds its knobs; LoRA and residual added after it) or "gemv" (`fp4_gemv.fp4_gemm_gemv`, the
            skinny-M kernel: M <= 16, no LoRA / residual) or "mma" (`fp4_mma.fp4_gemm_mma`, the decode-size
            MMA kernel: M <= 8, every epilogue). Default: "mma" where `fp4_mma.selected` says so (a committed
            measurement with its knobs, QERL_FP4_MMA=1, or its DEFAULT_ON); else "gemv" where `fp4_gemv.selected`
            says so (a committed measurement, or QERL_FP4_GEMV=1); else "swap" for M <= 64; above, the fastest of
            `forward_candidates` (swap up to FUSED_MAX_M, wgmma on Hopper up to WGMMA_MAX_M, tc up to TC_MAX_M, deq)
            as timed on first use per shape, M bucket and epilogue (`_choose_path`).
        lora: optional (t [M, R], B [N, R]): a LoRA update t @ B^T added in the epilogue (B already scaled, R a
            power of two >= 16, B contiguous); single weights only.
        residual: optional [M, N] added last (the residual stream, so y is the new hidden state).

    Returns:
        [M, N] tensor.

    Raises:
        ValueError: shape, dtype or device mismatch.
    """
    _check_2d(x, w, w.k, "fp4_gemm", "x")
    m = x.shape[0]
    if lora is not None:
        t, lb = lora
        if t.shape != (m, lb.shape[1]) or lb.shape[0] < w.n or not lb.is_contiguous() or \
                lb.shape[1] < 16 or lb.shape[1] & (lb.shape[1] - 1):
            raise ValueError(f"fp4_gemm: LoRA t {tuple(t.shape)} / B {tuple(lb.shape)} do not fit x [{m}, {w.k}] "
                             f"and a single weight of {w.n} rows (B contiguous, rank a power of two >= 16)")
    if residual is not None and tuple(residual.shape) != (m, w.n):
        raise ValueError(f"fp4_gemm: residual {tuple(residual.shape)} is not [{m}, {w.n}]")
    gemv_knobs = mma_knobs = None
    if path is None and fused is None:
        from qerl_kernels import fp4_mma  # imports this module: imported here, not at the top
        mma_knobs = fp4_mma.selected(x, w)
        if mma_knobs is not None:
            path = "mma"
    if path is None and fused is None and lora is None and residual is None:
        from qerl_kernels import fp4_gemv  # imports this module: imported here, not at the top
        gemv_knobs = fp4_gemv.selected(x, w)
        if gemv_knobs is not None:
            path = "gemv"
    if path is None:
        path = {True: "swap", False: "deq"}.get(fused) or _choose_path(x, w, bias, lora, residual)
    if path == "wgmma":  # the Gluon kernel has no LoRA / residual epilogue: both follow as cuBLAS / an add
        from qerl_kernels.fp4_wgmma import fp4_gemm_wgmma  # imports this module: imported here, not at the top
        return _add_extras(fp4_gemm_wgmma(x, w, bias, **(config or {})), w, lora, residual)
    if path == "mma":
        from qerl_kernels import fp4_mma
        return fp4_mma.fp4_gemm_mma(x, w, bias, lora=lora, residual=residual,
                                    config=config if config is not None else mma_knobs or None)
    if path == "gemv":
        if lora is not None or residual is not None:
            raise ValueError("fp4_gemm: path 'gemv' has no LoRA / residual epilogue")
        from qerl_kernels.fp4_gemv import fp4_gemm_gemv
        return fp4_gemm_gemv(x, w, bias, config=config if config is not None else gemv_knobs)
    if path == "tc":
        return fp4_gemm_tc(x, w, bias, lora=lora, residual=residual, config=config)
    if path == "deq":
        return _add_extras(torch.nn.functional.linear(x, fp4_dequantize(w, x.dtype), bias), w, lora, residual)
    x = x.contiguous()
    y = torch.empty((m, w.n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    kw = w.words.shape[1] * 8
    bf16 = x.dtype == torch.bfloat16
    interp = interpret_mode()
    dummy = w.out_scales  # pointer for the absent optional operands
    bias_arg = bias.contiguous() if bias is not None else dummy
    t_arg, lb_arg = (lora[0], lora[1]) if lora is not None else (dummy, dummy)
    res_arg = residual if residual is not None else dummy
    if interp and config is None:
        config = dict(STREAM_K=True, BM=16, BN=64, BK=128, GROUP_M=1, CPS=1, num_warps=4, num_stages=1)
    n_sm = 2 if interp else _num_sms(x.device.index or 0)
    # workspace for the largest stream-K config: grid <= 4 CTAs/SM, two partial slots each of BN*BM floats
    ws, cnt = _workspace(x.device, n_sm * 4 * 2 * 128 * 64, _tiles_upper_bound(m, w.n))
    args = (x, w.words, w.scales, w.out_scales, bias_arg, y, ws, cnt, t_arg, lb_arg, res_arg,
            m, w.n, w.k, kw, _bucket_m(m),
            x.stride(0), w.words.stride(0), w.scales.stride(0), y.stride(0), w.out_scales.stride(0),
            t_arg.stride(0), res_arg.stride(0))
    meta = dict(SCALE_KIND=w.scale_kind, BF16=bf16, HAS_BIAS=bias is not None, USE_ASM=_use_asm(interp),
                HAS_LORA=lora is not None, R=lora[1].shape[1] if lora is not None else 16,
                HAS_RES=residual is not None)

    def grid(c):
        k_steps = kw // c["BK"]
        units = -(-m // c["BM"]) * -(-w.n // c["BN"]) * k_steps
        if c["STREAM_K"]:
            # at least k_steps / parts steps per CTA, so a tile has at most ~parts + 1 partial sums to reduce
            min_per = -(-k_steps // (MAX_PARTS if c["BM"] <= 16 else MAX_PARTS // 2))
            return (max(1, min(n_sm * c["CPS"], units // min_per)),)
        return (units // k_steps,)

    if config is not None:
        meta["EVEN_K"] = w.k % config["BK"] == 0
    _launch(_fp4_gemm, _fp4_gemm_tuned, grid, args, meta, config)
    return y


TC_MAX_M = int(os.environ.get("QERL_FP4_TC_MAX_M", "16384"))
# The tensor-core tiles are a dispatch candidate only on request: on an H200 (results/measured/h200/
# kernels.run4.*) they ran 0.31-0.51x bf16 forward and 2-5.8x slower backward at every M (ncu: one CTA of 4-8
# warps per SM, 80 % of issue slots without an eligible warp), so timing them on first use only costs compiles.
TC_IN_DISPATCH = os.environ.get("QERL_FP4_TC", "0") not in ("", "0")
# The Gluon wgmma kernel (fp4_wgmma.py) joins the timed choice above FUSED_MIN_TRY on Hopper: on an H200 (issue 22,
# results/measured/h200/kernels/call6) it beat the default path on the 7B gate/up and down launches at M 128-256 by
# 1.2-2.0x and lost on the q/k/v/o ones, which the timing leaves to the others. QERL_FP4_WGMMA=0 leaves it out.
WGMMA_MAX_M = 512
WGMMA_IN_DISPATCH = os.environ.get("QERL_FP4_WGMMA", "1") not in ("", "0")
_DISPATCH: dict = {}


def _add_extras(y: torch.Tensor, w, lora: tuple | None, residual: torch.Tensor | None) -> torch.Tensor:
    """y (+ t @ B^T) (+ residual), in place: the LoRA term and the residual of the paths without that epilogue."""
    if lora is not None:
        y.addmm_(lora[0], lora[1][:w.n].t())
    if residual is not None:
        y += residual
    return y


def forward_candidates(x: torch.Tensor, w) -> list[str]:
    """The paths `fp4_gemm`'s default dispatch times for x [M, K] and weight w, first the one taken untimed
    (interpreter, CPU, graph capture): "swap" alone up to FUSED_MIN_TRY; above, "swap" up to FUSED_MAX_M, "wgmma"
    (`fp4_wgmma.fp4_gemm_wgmma`, the Gluon wgmma kernel) for NVFP4 single weights and groups on a Hopper GPU up to
    WGMMA_MAX_M unless QERL_FP4_WGMMA=0, "tc" with QERL_FP4_TC=1 up to TC_MAX_M, and "deq"."""
    m = x.shape[0]
    if m <= FUSED_MIN_TRY:
        return ["swap"]
    return ((["swap"] if m <= FUSED_MAX_M else []) + (["wgmma"] if _wgmma_eligible(x, w) else [])
            + (["tc"] if TC_IN_DISPATCH and m <= TC_MAX_M else []) + ["deq"])


def _wgmma_eligible(x: torch.Tensor, w, backward: bool = False) -> bool:
    """Whether the Gluon wgmma kernel takes this product: the forward's (fp4_wgmma: x [M, K]) or, with `backward`,
    the backward's (fp4_wgmma_t: x = grad_y [M, N], NVFP4 single weights only). NVFP4, M <= WGMMA_MAX_M (above,
    `dequantize_only_above`: small layers keep their dequantized copy there), whole 256-column tiles of K_pad, x rows
    of a multiple of 16 bytes (TMA), a Hopper GPU, QERL_FP4_WGMMA not 0."""
    if (not WGMMA_IN_DISPATCH or x.shape[0] > WGMMA_MAX_M or not x.is_cuda or w.scale_kind != 0 or interpret_mode()
            or (backward and w.row_scale)):
        return False
    from qerl_kernels.fp4_gluon import BK, HAVE_GLUON
    # the kernels' TMA tiles: whole 256-column k-steps (K_pad; rows are padded to 128 already) and x rows of a
    # multiple of 16 bytes; e.g. SmolLM2's K = 576 (K_pad 640) is not taken
    if (w.words.shape[1] * 8) % BK or (w.n if backward else w.k) % 8:
        return False
    return HAVE_GLUON and torch.cuda.get_device_capability(x.device)[0] == 9


def _choose_path(x: torch.Tensor, w, bias, lora=None, residual=None) -> str:
    """The first of `forward_candidates` when it is the only one; else the fastest, timed once per shape, M
    bucket and epilogue (do_bench of the whole call, LoRA and residual included: "wgmma" adds them as separate
    launches, "swap" in its epilogue). Interpreter, CPU and graph capture: the first candidate. A call whose
    choice was made once reads it from the table before anything else (this runs on every eager call)."""
    if x.shape[0] <= FUSED_MIN_TRY:
        return "swap"
    key = (w.n, w.k, _bucket_m(x.shape[0]), x.dtype, w.scale_kind, x.device.index, lora is not None,
           residual is not None)
    if key not in _DISPATCH:
        cands = forward_candidates(x, w)
        if len(cands) == 1 or interpret_mode() or not x.is_cuda or torch.cuda.is_current_stream_capturing():
            return cands[0]
        times = {p: _time_or_inf(lambda p=p: fp4_gemm(x, w, bias, path=p, lora=lora, residual=residual), p,
                                 graph=True) for p in cands}
        _DISPATCH[key] = min(times, key=times.get)
    return _DISPATCH[key]


def dequantize_only_above() -> int:
    """The M above which `fp4_gemm` and `fp4_gemm_t` have one candidate path only, dequantize + cuBLAS: above the
    fused kernels' limits (FUSED_MAX_M, BWD_FUSED_MAX_M, WGMMA_MAX_M: the forward and backward wgmma kernels) and,
    when the tensor-core tiles are in the dispatch, theirs (TC_MAX_M). A caller that keeps the dequantized weight
    (`fp4_dequantize`) may compute such products itself."""
    return max(FUSED_MAX_M, BWD_FUSED_MAX_M, WGMMA_MAX_M if WGMMA_IN_DISPATCH else 0,
               TC_MAX_M if TC_IN_DISPATCH else 0)


def _time_or_inf(fn, name: str, graph: bool = False) -> float:
    """Milliseconds of one call of fn, or inf (with a message) if it cannot compile or run on this device.

    graph=True (the forward's choice for M 65-512, i.e. decode steps, which the rollout engine replays as CUDA
    graphs): GPU time of calls replayed in a CUDA graph (triton.testing.do_bench_cudagraph), falling back to the
    eager timing if fn cannot be captured. Eager timing (do_bench) also counts the host's launch cost whenever it
    exceeds the kernel's: for the wgmma kernel (TMA descriptors built per call, then the LoRA addmm and the residual
    add) that cost is tens of microseconds, which a graph replay does not pay. Timed eagerly, the kernel never won
    a decode-step choice (issue 22, H100 call 7: the 7B rollout unchanged); timed in a graph it takes gate/up and
    down at M 128-256 (call 8, with the engine's groups in one allocation: QeRL / BF16 LoRA 0.90 -> 1.04x at batch
    128). The backward (training, eager) keeps the eager timing, as the median of its calls: on the H100 machine's
    host an eager call's time varies by tens of microseconds from one call to the next (call 109, 7B gate at M =
    256, 105.4 us graph-timed: a mean of 108.6 us eager through the JIT, 177.6 through the cheaper cached launch),
    and the mean chose the slower path for the 7B down weight at M = 128."""
    try:
        if graph:
            try:
                return triton.testing.do_bench_cudagraph(fn, rep=10)
            except Exception:  # noqa: BLE001 - not capturable: timed as it will run, eagerly
                torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")
    except Exception as e:  # noqa: BLE001 - a path that does not compile here is simply not chosen
        print(f"kernels: path {name!r} unavailable: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return float("inf")


def dispatch_table() -> dict:
    """The paths chosen so far: {(n, k, M bucket, dtype, format, device, LoRA, residual): path} (for benchmarks)."""
    return dict(_DISPATCH)


def fp4_gemm_tc(a: torch.Tensor, w, bias: torch.Tensor | None = None, *, forward: bool = True,
                lora: tuple | None = None, residual: torch.Tensor | None = None,
                config: dict | None = None) -> torch.Tensor:
    """The tensor-core tiles (`_fp4_gemm_tc`): forward y = a @ W^T (+ bias, LoRA, residual as `fp4_gemm`), or
    backward (forward=False) grad_x = a @ W for a single weight; for M >= 64 or so.

    Args:
        a: [M, K] (forward) or [M, w.n] (backward), float16/bfloat16, on the weight's device.
        w: PreparedFP4 (forward: also groups; backward: single weights).
        config: force one config (dict of BM, BN, BK, GROUP_M, num_warps, num_stages).

    Returns:
        [M, w.n] (forward) or [M, w.k] (backward).

    Raises:
        ValueError: shape, dtype or device mismatch, or a group / extras in the backward.
    """
    if forward:
        _check_2d(a, w, w.k, "fp4_gemm_tc", "x")
        no, kr, rp, wb = w.n, w.k, w.words.shape[1] * 8, w.words.shape[0]
    else:
        _check_2d(a, w, w.n, "fp4_gemm_tc", "grad")
        if w.row_scale or lora is not None or residual is not None or bias is not None:
            raise ValueError("fp4_gemm_tc: the backward takes a single weight and no bias / LoRA / residual")
        no, kr, rp, wb = w.k, w.n, w.words.shape[0], w.words.shape[1] * 8
    m = a.shape[0]
    a = a.contiguous()
    o = torch.empty((m, no), dtype=a.dtype, device=a.device)
    if m == 0:
        return o
    interp = interpret_mode()
    if interp and config is None:
        config = dict(BM=64, BN=128 if not forward else 64, BK=128, GROUP_M=8, num_warps=4, num_stages=1)
    dummy = w.out_scales
    t_arg, lb_arg = (lora[0], lora[1]) if lora is not None else (dummy, dummy)
    res_arg = residual if residual is not None else dummy
    args = (a, w.words, w.scales, w.out_scales, bias.contiguous() if bias is not None else dummy, o,
            t_arg, lb_arg, res_arg,
            m, no, kr, rp, wb, _bucket_m(m),
            a.stride(0), w.words.stride(0), w.scales.stride(0), o.stride(0), w.out_scales.stride(0),
            t_arg.stride(0), res_arg.stride(0))
    meta = dict(SCALE_KIND=w.scale_kind, BF16=a.dtype == torch.bfloat16, HAS_BIAS=bias is not None,
                USE_ASM=_use_asm(interp), FORWARD=forward, HAS_LORA=lora is not None,
                R=lora[1].shape[1] if lora is not None else 16, HAS_RES=residual is not None)

    def grid(c):
        return (-(-m // c["BM"]) * -(-no // c["BN"]),)

    _launch(_fp4_gemm_tc, _fp4_gemm_tc_tuned, grid, args, meta, config)
    return o


def _bucket_m(m: int) -> int:
    """Autotuning key for M: 16, 32, 64, then powers of two."""
    return max(16, 1 << (max(m, 1) - 1).bit_length())


def _tiles_upper_bound(m: int, n: int) -> int:
    return -(-m // 16) * -(-n // 64)


def fp4_dequantize(w: PreparedFP4, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The dense weight [N, K] in `dtype` (float16 or bfloat16), exact (one rounding of the float32 value).

    Args:
        w: the prepared weight.
        dtype: torch.float16 or torch.bfloat16.

    Returns:
        [N, K] tensor on the weight's device.

    Raises:
        ValueError: unsupported dtype.
    """
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"fp4_dequantize: dtype must be float16 or bfloat16, got {dtype}")
    out = torch.empty((w.n, w.k), dtype=dtype, device=w.words.device)
    interp = interpret_mode()
    bn, bk = (64, 128) if interp else (64, 256 if (w.words.shape[1] * 8) % 256 == 0 else 128)
    grid = (w.words.shape[0] // bn, (w.words.shape[1] * 8) // bk)
    _fp4_dequant[grid](w.words, w.scales, w.out_scales, out, w.n, w.k, w.words.stride(0), w.scales.stride(0),
                       out.stride(0), w.out_scales.stride(0), SCALE_KIND=w.scale_kind, BF16=dtype == torch.bfloat16, USE_ASM=not interp,
                       BN=bn, BK=bk, num_warps=4, num_stages=1)
    return out


BWD_FUSED_MIN_TRY = 64
BWD_FUSED_MAX_M = int(os.environ.get("QERL_FP4_BWD_FUSED_MAX_M", "256"))


def fp4_gemm_t(g: torch.Tensor, w: PreparedFP4, *, config: dict | None = None,
               fused: bool | None = None, path: str | None = None) -> torch.Tensor:
    """grad_x = g @ W (the backward input gradient of y = x @ W^T), fp32 accumulation, output in g's dtype.

    Args:
        g: [M, n] float16/bfloat16 (n = w.n; for a group, the rows of all members, padding included).
        w: the prepared weight or group.
        config: force one config (dict of BM, BKO, BNR, SPLIT_X, num_warps, num_stages) instead of autotuning.
        fused: force the fused transposed kernel (True) or dequantize + cuBLAS (False).
        path: force "swap" (that kernel), "wgmma" (`fp4_wgmma_t.fp4_gemm_t_wgmma`: NVFP4 single weights on a
            Hopper GPU), "tc" (`fp4_gemm_tc(forward=False)`, single weights) or "deq". Default: "swap" for M <= 64;
            above, the fastest of `backward_candidates`, timed on first use per shape and M bucket.
            (First H200 run: with a timed choice from M = 17 on, do_bench picked dequantize + cuBLAS for the
            3584 x 3584 weight at M = 32 and 64 although graph-timed the fused kernel was 1.2-1.4x faster there;
            at M <= 64 the fused kernel won or tied on every Qwen2.5-7B shape.)

    Returns:
        [M, w.k] tensor.

    Raises:
        ValueError: shape, dtype or device mismatch.
    """
    _check_2d(g, w, w.n, "fp4_gemm_t", "grad")
    m = g.shape[0]
    if path is None:
        path = {True: "swap", False: "deq"}.get(fused) or _choose_path_t(g, w)
    if path == "deq":
        return g @ fp4_dequantize(w, g.dtype)
    if path == "tc":
        return fp4_gemm_tc(g, w, forward=False, config=config)
    if path == "wgmma":
        from qerl_kernels.fp4_wgmma_t import fp4_gemm_t_wgmma
        return fp4_gemm_t_wgmma(g, w)
    g = g.contiguous()
    o = torch.empty((m, w.k), dtype=g.dtype, device=g.device)
    if m == 0:
        return o
    n_pad, kw = w.words.shape[0], w.words.shape[1] * 8
    interp = interpret_mode()
    if interp and config is None:
        config = dict(BM=16, BKO=128, BNR=64, SPLIT_X=1, num_warps=4, num_stages=1)
    n_sm = 2 if interp else _num_sms(g.device.index or 0)
    # workspace: at most (programs per SM 4) * SMs programs' partial tiles, plus one tile per program slack
    mb = -(-m // 16)
    ws, cnt = _workspace(g.device, max(n_sm * 8, 64) * 128 * 64 + kw * mb * 16, mb * (kw // 128))
    bf16 = g.dtype == torch.bfloat16
    args = (g, w.words, w.scales, w.out_scales, o, ws, cnt, m, w.n, w.k, n_pad, kw, _bucket_m(m),
            g.stride(0), w.words.stride(0), w.scales.stride(0), o.stride(0), w.out_scales.stride(0))
    meta = dict(SCALE_KIND=w.scale_kind, BF16=bf16, USE_ASM=_use_asm(interp), ROW_SCALE=w.row_scale)

    def grid(c):
        kb, mbk = kw // c["BKO"], -(-m // c["BM"])
        blocks = n_pad // c["BNR"]
        # ceil: an output of >= n_sm column blocks (down_proj's 148) still gets 2+ splits (the first H200 run
        # used floor and ran it on 148 CTAs, 4.7 warps per SM)
        want = max(1, -(-(n_sm * c["SPLIT_X"]) // (kb * mbk)))
        # the workspace holds ws.numel() floats: keep splits * tiles * tile size inside it
        want = min(want, blocks, max(1, ws.numel() // (kb * mbk * c["BKO"] * c["BM"])))
        rows = -(-blocks // want)
        return (kb, -(-blocks // rows), mbk)

    _launch(_fp4_gemm_t, _fp4_gemm_t_tuned, grid, args, meta, config)
    return o


def backward_candidates(g: torch.Tensor, w: PreparedFP4) -> list[str]:
    """The paths `fp4_gemm_t`'s default dispatch times for g [M, N], first the one taken untimed: "swap" alone up
    to BWD_FUSED_MIN_TRY; above, "swap" up to BWD_FUSED_MAX_M, "wgmma" (`fp4_wgmma_t.fp4_gemm_t_wgmma`) where
    `_wgmma_eligible(..., backward=True)`, "tc" with QERL_FP4_TC=1, and "deq"."""
    m = g.shape[0]
    if m <= BWD_FUSED_MIN_TRY:
        return ["swap"]
    return ((["swap"] if m <= BWD_FUSED_MAX_M else []) + (["wgmma"] if _wgmma_eligible(g, w, backward=True) else [])
            + (["tc"] if TC_IN_DISPATCH and m <= TC_MAX_M and not w.row_scale else []) + ["deq"])


def _choose_path_t(g: torch.Tensor, w: PreparedFP4) -> str:
    """The backward's `_choose_path`: "swap" up to BWD_FUSED_MIN_TRY, else the fastest of `backward_candidates`,
    timed once per shape and M bucket (eagerly: the backward runs eagerly)."""
    m = g.shape[0]
    if m <= BWD_FUSED_MIN_TRY:
        return "swap"
    key = ("t", w.n, w.k, _bucket_m(m), g.dtype, w.scale_kind, w.row_scale, g.device.index)
    if key not in _DISPATCH:   # the candidates only for a choice not made yet (this runs on every eager call)
        cands = backward_candidates(g, w)
        if interpret_mode() or not g.is_cuda or torch.cuda.is_current_stream_capturing():
            return cands[0]
        times = {p: _time_or_inf(lambda p=p: fp4_gemm_t(g, w, path=p), p) for p in cands}
        _DISPATCH[key] = min(times, key=times.get)
    return _DISPATCH[key]
