"""FP4 (NVFP4 / MXFP4) W4A16 kernel family: load-time weight layout, E2M1 decoder, fused dequantize-GEMM,
standalone dequantize, and their launch wrappers. nvfp4.py and mxfp4.py are thin format front ends over this file.

Why this shape (the kernels issue): 4-bit weights pay only if the matmul streams 4.5 bits per weight at close to HBM
bandwidth. A plain "decode E2M1 with a bit trick, then tl.dot" Triton kernel stalls on decode and data movement far
below that (0.3-0.9 TB/s measured). What this file does instead, Marlin-style:

1. Weights are re-laid-out ONCE at load time (`prepare_codes`): every 32-bit word holds the 8 codes that one GPU
   thread needs for its wgmma A-operand fragment (k = 32b + 8q + 2c + r for lane-quad c, word b, q = 0..3,
   r = 0..1), with the nibble bits placed so that each pair of codes becomes an fp16x2/bf16x2 register in 2-4
   integer instructions (11 per word for fp16, 13 for bf16, found by exhaustive search over shift/mask layouts).
   A thread loads its 4 words of a 128-wide k chunk with one 16-byte shared-memory load, and Triton's layout
   propagation maps the decoded tile onto the MMA operand layout with no data exchange between threads.
2. "Swap AB": the kernel computes y^T = W @ x^T, so the decoded weight tile is wgmma's A operand straight from
   registers (never written to shared memory) and the activations, tiny at decode, are the B operand (M padded
   to 16).
3. Block scales are applied with one packed multiply per pair of weights, in the MMA's own precision, and the
   products are exact: e2m1 (2 significant bits) times an E4M3 scale (4 bits) needs 6 bits and stays inside
   fp16's / bf16's range with the biases chosen below; the per-tensor factor is applied once to the fp32 result.
   NVFP4 scales are stored re-encoded as "e5m3" bytes (value 2**(e5 - 10) * (1 + m3 / 8)) so that two of them
   become an fp16x2 or bf16x2 register with one shift-add.
4. Decode shapes (M <= 64) use stream-K: a persistent grid of about 2 CTAs per SM splits (tile, k-step) work
   evenly; tiles shared by several CTAs are reduced deterministically by the last CTA to finish (fp32 partials
   in a workspace, an arrival counter that resets itself), so one launch does the whole product.
5. Larger M uses the same kernel with one tile per CTA; very large M uses the standalone dequantize kernel followed
   by cuBLAS, which wins there (the decode cost is amortised over M); between 64 and FUSED_MAX_M the faster of the
   two is timed once per shape. A third path, tensor-core tiles in the natural orientation (`fp4_gemm_tc`: the
   decoded tile staged through shared memory as wgmma's B operand), forward and backward, is built and tested but
   joins that timed choice only with QERL_FP4_TC=1: on an H200 it ran 0.31-0.51x cuBLAS (one CTA per SM, decode not
   overlapped with the MMA; results/measured/h200/kernels.notes.md, iteration 3).
6. The backward input gradient grad_x = grad_y @ W (`fp4_gemm_t`) decodes the same tiles in a transposed kernel,
   split over W's rows with a deterministic last-arrival reduction, up to M = 64; dequantize + cuBLAS above.
7. Per-row output factors (`out_scales` [2, N_pad]) let several weights of one K run as one launch
   (`concat_prepared`: q/k/v, gate/up), each with its own per-tensor scale.
8. Segments (`segment_prepared`): the same one launch over weights left where they are (a model's own q/k/v
   buffers): each 128-row block of the virtual stacked weight reads its member's words, scales and factors through
   an offset table, so a reader (the decode engine) groups them without copying or re-homing them. The epilogue can
   also add a LoRA update t @ B^T (one small MMA per tile) and the residual stream, so o_proj / down_proj of a
   decode step are one launch each (`prepared_ops.fp4_linear_fused`).

Numerics: dequantized weights are exact (bit-identical to the float32 reference cast to the MMA dtype, up to the
documented fp16 range limits); products accumulate in fp32 (wgmma); the output is rounded once to x's dtype.
fp16 activations run the fp16 MMA, bf16 activations the bf16 MMA. MXFP4 with fp16 activations flushes blocks
whose scale is below 2**-14 times 2**(d) to zero (d: the largest scale exponent minus 1), as fp16 itself would.

CPU: TRITON_INTERPRET=1 runs the same kernels with a pure-Triton decoder instead of the inline PTX (tests/kernels).
"""
from __future__ import annotations

import functools
import os
import weakref
from dataclasses import dataclass

import torch

try:  # triton is optional on CPU-only installs; the torch reference path works without it
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAVE_TRITON = False

__all__ = [
    "CHUNK", "ROW_ALIGN", "PreparedFP4", "SegmentedFP4", "segment_prepared", "prepare_codes", "fp4_gemm",
    "fp4_gemm_t", "fp4_gemm_tc", "fp4_dequantize", "concat_prepared", "dequantize_prepared_reference",
    "interpret_mode", "dispatch_table", "FUSED_MAX_M", "BWD_FUSED_MAX_M", "TC_MAX_M",
]

CHUNK = 128      # k elements per storage chunk (16 words per row)
ROW_ALIGN = 128  # rows padded to a multiple of this (largest BN)
# Dispatch by M (see results/measured/*/kernels.csv): the fused kernel up to FUSED_MIN_TRY, dequantize + cuBLAS
# above FUSED_MAX_M, and in between whichever of the two was faster when first timed for that shape.
FUSED_MIN_TRY = 64
FUSED_MAX_M = int(os.environ.get("QERL_FP4_FUSED_MAX_M", "512"))
# Tests set this to False to run the pure-Triton decoder on a GPU (None: inline PTX unless interpreting).
USE_ASM_OVERRIDE: bool | None = None
MAX_PARTS = 8  # stream-K: most CTAs that share one output tile (bounds the serial reduction)

# Bit positions of pair q (codes j = 2q and 2q + 1 of a word; +16 for the second of the pair):
# sign bit and the low bit of the 3-bit exponent/mantissa field. Chosen by exhaustive search (see docstring).
_SIGN_POS = (15, 14, 13, 12)
_EM_POS = (9, 3, 0, 6)


def interpret_mode() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# --------------------------------------------------------------------------------------------------------------
# Load-time layout (torch)
# --------------------------------------------------------------------------------------------------------------
@dataclass
class PreparedFP4:
    """A 4-bit weight in the kernels' layout (built once by nvfp4.prepare / mxfp4.prepare).

    Attributes:
        words: int32 [N_pad, K_pad // 8], see `prepare_codes`.
        scales: NVFP4: int16 [N_pad, K_pad // 32] (two e5m3 bytes, group 2b low); MXFP4: uint8 [N_pad, K_pad // 32].
        out_scales: float32 [2, N_pad]: the factor applied to each row's fp32 result for fp16 (row 0) and bf16
            (row 1) MMAs (one value per row, so that weights with different per-tensor factors can share a launch).
        n, k: the logical weight shape [n, k] (for a group: n = the rows of all members, padding included).
        scale_kind: 0 NVFP4, 1 MXFP4.
        parts: for a group built by `concat_prepared`: (first row, rows) of each member; () for a single weight.
    """

    words: torch.Tensor
    scales: torch.Tensor
    out_scales: torch.Tensor
    n: int
    k: int
    scale_kind: int
    parts: tuple = ()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.words, self.scales, self.out_scales))

    @property
    def row_scale(self) -> bool:
        """True for a group of several weights (rows carry different factors)."""
        return len(self.parts) > 1


class PreparedCache:
    """Cache of prepared weights keyed on the storage tensors, so callers can keep passing the storage layout.

    An entry is rebuilt when any source tensor is replaced (data pointer) or modified in place (version counter),
    and dropped when the first source tensor is garbage-collected. The prepared copy costs another 4.5 bits per
    weight on the device beside the storage layout; QuantLinear avoids it by holding only the prepared form
    (qerl/layers/quant_linear.py) and calling the ops over prepared tensors (kernels/prepared_ops.py).
    """

    def __init__(self, build):
        self._build = build
        self._entries: dict[int, tuple] = {}

    def get(self, *tensors: torch.Tensor) -> PreparedFP4:
        key = id(tensors[0])
        stamp = tuple((t.data_ptr(), t._version, tuple(t.shape), t.device) for t in tensors)
        hit = self._entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        prepared = self._build(*tensors)
        if hit is None:
            weakref.finalize(tensors[0], self._entries.pop, key, None)
        self._entries[key] = (stamp, prepared)
        return prepared

    def clear(self) -> None:
        self._entries.clear()


def padded_shape(n: int, k: int) -> tuple[int, int]:
    """(N_pad, K_pad): rows to a multiple of ROW_ALIGN, columns to a multiple of CHUNK."""
    return -(-n // ROW_ALIGN) * ROW_ALIGN, -(-k // CHUNK) * CHUNK


def row_out_scales(factors: torch.Tensor, n_pad: int) -> torch.Tensor:
    """float32 [2] (fp16 factor, bf16 factor) -> the per-row table float32 [2, n_pad] of PreparedFP4.out_scales."""
    return factors.detach().float().reshape(2, 1).expand(2, n_pad).contiguous()


def concat_prepared(members) -> PreparedFP4:
    """Stack several prepared weights of the same K and format along N, for one launch over all of them.

    Why: at decode sizes each launch costs ~5 us whatever its size, so q/k/v (and gate/up) as one GEMM save two
    (one) launches per layer. Each member keeps its own per-tensor factor (per-row `out_scales`) and its rows stay
    padded to ROW_ALIGN, so every 128-row block belongs to one member and the result is exactly what the members
    give one by one. `fp4_linear_grouped` splits the output back into one view per member.

    Args:
        members: PreparedFP4 weights with equal k and scale_kind, on one device (not groups themselves).

    Returns:
        PreparedFP4 with `parts` = ((first row, rows), ...) and n = the padded rows of all but the last member plus
        the rows of the last (a copy: the members' tensors are not referenced).

    Raises:
        ValueError: mismatched K, format or device, or an empty list.
    """
    members = list(members)
    if not members:
        raise ValueError("concat_prepared: no weights given")
    k, kind, dev = members[0].k, members[0].scale_kind, members[0].words.device
    for p in members:
        if p.k != k or p.scale_kind != kind or p.words.device != dev or p.parts:
            raise ValueError(f"concat_prepared: members must share K, format and device and not be groups; got "
                             f"{[(q.n, q.k, q.scale_kind, str(q.words.device), bool(q.parts)) for q in members]}")
    parts, row = [], 0
    for p in members:
        parts.append((row, p.n))
        row += p.words.shape[0]
    return PreparedFP4(torch.cat([p.words for p in members]).contiguous(),
                       torch.cat([p.scales for p in members]).contiguous(),
                       torch.cat([p.out_scales for p in members], dim=1).contiguous(),
                       parts[-1][0] + parts[-1][1], k, kind, tuple(parts))


@dataclass
class SegmentedFP4:
    """Several prepared weights of one K multiplied as one launch WITHOUT copying them (`segment_prepared`).

    The members stay where they are (e.g. a model's q/k/v QuantLinear buffers); the kernel maps each 128-row block
    of the virtual stacked weight to its member through `table` (element offsets from the first member's tensors),
    so the output is exactly what `concat_prepared` of the same members gives, at no extra memory.

    Attributes:
        members: the PreparedFP4 weights (held, so their memory stays valid while this object lives).
        parts: (first virtual row, rows) of each member; members start at multiples of ROW_ALIGN.
        n, k, scale_kind: the virtual weight's rows (padded rows of all but the last member + the last's rows), K,
            format.
        table: int64 [2, blocks, 3]: for the fp16 (0) / bf16 (1) MMA and each 128-row block, the element offsets
            that map a virtual row to the member's words, scales and per-row factor.
    """

    members: tuple
    parts: tuple
    n: int
    k: int
    scale_kind: int
    table: torch.Tensor

    @property
    def words(self) -> torch.Tensor:
        return self.members[0].words

    @property
    def scales(self) -> torch.Tensor:
        return self.members[0].scales

    @property
    def out_scales(self) -> torch.Tensor:
        return self.members[0].out_scales

    @property
    def row_scale(self) -> bool:
        return True

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.members)

    def data_ptrs(self) -> tuple:
        """The members' tensors' addresses (the table is valid while these are unchanged)."""
        return tuple(t.data_ptr() for p in self.members for t in (p.words, p.scales, p.out_scales))


def segment_prepared(members) -> SegmentedFP4:
    """Group prepared weights of one K for a single launch of `fp4_gemm`, without copying them.

    Args:
        members: PreparedFP4 single weights with equal k, format, device and row strides (e.g. q/k/v of a layer).

    Returns:
        SegmentedFP4 over the members.

    Raises:
        ValueError: mismatched members, or member tensors whose relative offsets are not multiples of 16
            elements (the kernel's alignment hint; allocations from PyTorch's allocator always are).
    """
    members = list(members)
    if not members:
        raise ValueError("segment_prepared: no weights given")
    p0 = members[0]
    for p in members:
        if (p.k, p.scale_kind, p.words.device, p.words.stride(0), p.scales.stride(0), p.scales.element_size()) != \
                (p0.k, p0.scale_kind, p0.words.device, p0.words.stride(0), p0.scales.stride(0),
                 p0.scales.element_size()) or p.parts or p.words.shape[0] % ROW_ALIGN:
            raise ValueError("segment_prepared: members must share K, format, device and strides, and not be groups; "
                             f"got {[(q.n, q.k, q.scale_kind, str(q.words.device), q.words.stride(0)) for q in members]}")
    parts, rows, entries = [], 0, []
    w0, s0, o0 = p0.words.data_ptr(), p0.scales.data_ptr(), p0.out_scales.data_ptr()
    for p in members:
        n_pad = p.words.shape[0]
        dw, rw = divmod(p.words.data_ptr() - w0, p.words.element_size())
        ds, rs = divmod(p.scales.data_ptr() - s0, p.scales.element_size())
        do, ro = divmod(p.out_scales.data_ptr() - o0, 4)
        w_off = dw - rows * p.words.stride(0)
        s_off = ds - rows * p.scales.stride(0)
        if rw or rs or ro or w_off % 16 or s_off % 16:
            raise ValueError("segment_prepared: member tensors are not 16-element aligned relative to each other")
        for b in range(n_pad // ROW_ALIGN):
            entries.append([(w_off, s_off, do + d * p.out_scales.stride(0) - rows) for d in (0, 1)])
        parts.append((rows, p.n))
        rows += n_pad
    table = torch.tensor(entries, dtype=torch.int64).permute(1, 0, 2).contiguous().to(p0.words.device)
    return SegmentedFP4(tuple(members), tuple(parts), parts[-1][0] + parts[-1][1], p0.k, p0.scale_kind, table)


def prepare_codes(codes: torch.Tensor) -> torch.Tensor:
    """Re-lay-out packed E2M1 codes for the kernels.

    Args:
        codes: uint8 [N, K // 2], element 2j in the low nibble (the storage contract).

    Returns:
        int32 [N_pad, K_pad // 8]. In row n, chunk t (128 columns), word 4c + b (c, b in 0..3) holds the codes of
        columns 128t + 32b + 8q + 2c + r for q in 0..3, r in 0..1; code (q, r) has its sign bit at
        _SIGN_POS[q] + 16r and its 3-bit exponent/mantissa field starting at bit _EM_POS[q] + 16r.
    """
    n, k = codes.shape[0], codes.shape[1] * 2
    n_pad, k_pad = padded_shape(n, k)
    c = torch.stack((codes & 0x0F, codes >> 4), dim=-1).flatten(-2).to(torch.int64)  # [N, K]
    c = torch.nn.functional.pad(c, (0, k_pad - k, 0, n_pad - n))
    c = c.view(n_pad, k_pad // CHUNK, 4, 4, 4, 2)  # [n, t, b, q, c, r]
    sign, em = (c >> 3) & 1, c & 7
    dev = codes.device
    r = torch.arange(2, device=dev) * 16
    sp = (torch.tensor(_SIGN_POS, device=dev)[:, None, None] + r).view(4, 1, 2)  # [q, c(bcast), r]
    ep = (torch.tensor(_EM_POS, device=dev)[:, None, None] + r).view(4, 1, 2)
    bits = (sign << sp) | (em << ep)                      # disjoint fields -> sum == or
    word = bits.sum(dim=(3, 5))                           # [n, t, b, c]
    word = word.permute(0, 1, 3, 2).reshape(n_pad, k_pad // 8)  # word index 4c + b
    word = torch.where(word >= 2 ** 31, word - 2 ** 32, word)
    return word.to(torch.int32).contiguous()


def unprepare_codes(words: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Inverse of `prepare_codes` (for tests): int32 [N_pad, K_pad // 8] -> uint8 codes [n, k // 2]."""
    n_pad, k_pad = words.shape[0], words.shape[1] * 8
    w = words.to(torch.int64) & 0xFFFFFFFF
    w = w.view(n_pad, k_pad // CHUNK, 4, 4).permute(0, 1, 3, 2)      # [n, t, b, c]
    dev = words.device
    r = torch.arange(2, device=dev) * 16
    sp = torch.tensor(_SIGN_POS, device=dev)[:, None] + r            # [q, r]
    ep = torch.tensor(_EM_POS, device=dev)[:, None] + r
    w = w[..., None, :, None]                                         # [n, t, b, q, c, r]
    codes = (((w >> sp[:, None, :]) & 1) << 3) | ((w >> ep[:, None, :]) & 7)
    codes = codes.reshape(n_pad, k_pad)[:n, :k].to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def e4m3_to_e5m3(scales: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn scales -> uint8 e5m3 bytes: value 2**(e5 - 10) * (1 + m3 / 8), 0 for a zero scale.

    Exact for every finite E4M3 value (subnormals are normalised: exponents -9..8 give e5 1..18). The byte 0
    decodes to 2**-10, so callers zero the codes of zero-scale blocks.
    """
    v = scales.float()
    m, e = torch.frexp(v)                                  # v = m * 2**e, m in [0.5, 1)
    e5 = (e - 1 + 10).clamp(min=0)
    m3 = ((m * 2 - 1) * 8).round().to(torch.int32)
    q = (e5 << 3) | m3
    return torch.where(v > 0, q, torch.zeros_like(q)).to(torch.uint8)


def e5m3_to_float(q: torch.Tensor) -> torch.Tensor:
    """uint8 e5m3 bytes -> float32 values (inverse of `e4m3_to_e5m3`; the byte 0 gives 0)."""
    q = q.to(torch.int32)
    v = torch.ldexp(1 + (q & 7).float() / 8, ((q >> 3) - 10).float())
    return torch.where(q > 0, v, torch.zeros_like(v))


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_prepared_reference(w: PreparedFP4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Plain-torch W [n, k] of a prepared weight (or group: rows of all members, padding rows 0), float32 math.

    Bit-identical to the formats' reference dequantization of the weight(s) it was prepared from: NVFP4
    e2m1 * scale * global_scale, MXFP4 e2m1 * 2**(scale - 127), each product in float32.
    """
    n_pad, k_pad = w.words.shape[0], w.words.shape[1] * 8
    codes = unprepare_codes(w.words, n_pad, k_pad).to(torch.int64)
    vals = torch.tensor(_E2M1, dtype=torch.float32, device=codes.device)[
        torch.stack((codes & 0x0F, codes >> 4), dim=-1).flatten(-2)]                    # [n_pad, k_pad]
    if w.scale_kind == 0:
        q = w.scales.contiguous().view(torch.uint8)                                      # [n_pad, k_pad // 16]
        blocks = vals.view(n_pad, -1, 16) * e5m3_to_float(q)[..., None]
        row = w.out_scales[1].float() * 2.0 ** -62                                       # = global scale
    else:
        blocks = torch.ldexp(vals.view(n_pad, -1, 32), (w.scales.to(torch.int32) - 127)[..., None].float())
        row = w.out_scales[1].float()                                                    # = 2**d
    out = blocks.reshape(n_pad, k_pad) * row[:, None]
    return out[:w.n, :w.k].to(dtype)


# --------------------------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------------------------
if HAVE_TRITON:
    def _asm(scale_kind: int, bf16: bool) -> str:
        """PTX for one 32-bit word -> 8 scaled fp16/bf16 values (code j = 2q + r), as Triton inline asm.

        Operands: $0..$7 the outputs, $8 the word, $9 the raw scale entry (16 bits) of the word's 32 columns (NVFP4: two
        e5m3 bytes, group 2b in byte 0; MXFP4: the re-biased E8M0 byte). Pair q has its sign bit at
        _SIGN_POS[q] (+16 for r = 1) and its exponent/mantissa field at _EM_POS[q]. fp16 wants sign at 15 and the
        field at 9..11, which reads as value * 2**-14; bf16 wants the field at 6..8, value * 2**-126. Subnormal
        results (code +-0.5) are exact in both. Then one packed multiply by the block scale per pair; the scale
        pair is built with one byte permute and one multiply-add (two bytes -> two 16-bit floats):
        NVFP4 fp16 bits (e5m3 << 7) + (5 << 10) equal the scale; bf16 bits (e5m3 << 4) + (181 << 7) the
        scale * 2**64. MXFP4 bf16: (s' + 126) << 7 = 2**(s' - 1); fp16: max(s' - 98, 0) << 10 = 2**(s' - 113).
        """
        if scale_kind == 0:
            sc = ("cvt.u32.u16 t, $9;\nprmt.b32 s, t, 0, 0x4140;\n" +
                  ("mad.lo.u32 s, s, 16, 0x5A805A80;" if bf16 else "mad.lo.u32 s, s, 128, 0x14001400;"))
        elif bf16:
            sc = "cvt.u32.u16 t, $9;\nprmt.b32 s, t, 0, 0x4040;\nmad.lo.u32 s, s, 128, 0x3F003F00;"
        else:
            sc = "cvt.u32.u16 t, $9;\nsub.s32 t, t, 98;\nmax.s32 t, t, 0;\nprmt.b32 s, t, 0, 0x4040;\nshl.b32 s, s, 10;"
        if bf16:
            dec = """
            shr.u32 t, $8, 3;
            and.b32 t, t, 0x01C001C0;
            lop3.b32 h0, $8, 0x80008000, t, 0xEA;
            shl.b32 a1, $8, 1;
            shl.b32 a3, $8, 3;
            and.b32 t, a3, 0x01C001C0;
            lop3.b32 h1, a1, 0x80008000, t, 0xEA;
            shl.b32 a2, $8, 2;
            shl.b32 a6, $8, 6;
            and.b32 t, a6, 0x01C001C0;
            lop3.b32 h2, a2, 0x80008000, t, 0xEA;
            and.b32 t, $8, 0x01C001C0;
            lop3.b32 h3, a3, 0x80008000, t, 0xEA;
            mov.b32 nz, 0x80008000;
            fma.rn.bf16x2 h0, h0, s0, nz;
            fma.rn.bf16x2 h1, h1, s0, nz;
            fma.rn.bf16x2 h2, h2, s1, nz;
            fma.rn.bf16x2 h3, h3, s1, nz;"""
        else:
            dec = """
            and.b32 h0, $8, 0x8E008E00;
            shl.b32 a1, $8, 1;
            shl.b32 a6, $8, 6;
            and.b32 t, a6, 0x0E000E00;
            lop3.b32 h1, a1, 0x80008000, t, 0xEA;
            shl.b32 a2, $8, 2;
            shl.b32 a9, $8, 9;
            and.b32 t, a9, 0x0E000E00;
            lop3.b32 h2, a2, 0x80008000, t, 0xEA;
            shl.b32 a3, $8, 3;
            and.b32 h3, a3, 0x8E008E00;
            mul.rn.f16x2 h0, h0, s0;
            mul.rn.f16x2 h1, h1, s0;
            mul.rn.f16x2 h2, h2, s1;
            mul.rn.f16x2 h3, h3, s1;"""
        return ("{\n.reg .b32 a1, a2, a3, a6, a9, t, s, s0, s1, h0, h1, h2, h3, nz;\n.reg .b16 sl, sh;\n" + sc +
                "\nmov.b32 {sl, sh}, s;\nmov.b32 s0, {sl, sl};\nmov.b32 s1, {sh, sh};" + dec +
                "\nmov.b32 {$0, $1}, h0;\nmov.b32 {$2, $3}, h1;\nmov.b32 {$4, $5}, h2;\nmov.b32 {$6, $7}, h3;\n}")

    _ASM_NV_F16 = tl.constexpr(_asm(0, False))
    _ASM_NV_BF16 = tl.constexpr(_asm(0, True))
    _ASM_MX_F16 = tl.constexpr(_asm(1, False))
    _ASM_MX_BF16 = tl.constexpr(_asm(1, True))

    @triton.jit
    def _decode_one(w, s2, SPOS: tl.constexpr, EPOS: tl.constexpr, HALF: tl.constexpr, BF16: tl.constexpr):
        # Pure-Triton twin of the PTX above for one code (the interpreter's path, and the readable spec).
        sign = (w >> SPOS) & 1
        em = (w >> EPOS) & 7
        if BF16:
            # float32 stand-in for the bf16 pair (the interpreter has no bf16 arithmetic): same exponent range,
            # so the field at bits 22..24 gives value * 2**-126 and bf16 bits << 16 are the scale; exact product.
            val = ((sign << 31) | (em << 22)).to(tl.float32, bitcast=True)
            sc = (((s2 >> (16 * HALF)) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
            return val * sc
        else:
            bits = (sign << 15) | (em << 9)
            val = bits.to(tl.int16).to(tl.float16, bitcast=True)
            sc = ((s2 >> (16 * HALF)) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
            return val * sc

    @triton.jit
    def _decode_words(w, sc, SCALE_KIND: tl.constexpr, BF16: tl.constexpr, USE_ASM: tl.constexpr):
        """int32 words + their raw scale entries (int32) -> 8 tensors of scaled values (code j = 2q + r)."""
        if USE_ASM:
            if SCALE_KIND == 0:
                if BF16:
                    o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
                        _ASM_NV_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, sc], dtype=(tl.bfloat16,) * 8,
                        is_pure=True, pack=1)
                else:
                    o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
                        _ASM_NV_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, sc], dtype=(tl.float16,) * 8,
                        is_pure=True, pack=1)
            else:
                if BF16:
                    o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
                        _ASM_MX_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, sc], dtype=(tl.bfloat16,) * 8,
                        is_pure=True, pack=1)
                else:
                    o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
                        _ASM_MX_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, sc], dtype=(tl.float16,) * 8,
                        is_pure=True, pack=1)
        else:
            s2 = _scale_pairs(sc, SCALE_KIND, BF16)
            o0 = _decode_one(w, s2, 15, 9, 0, BF16)
            o1 = _decode_one(w, s2, 31, 25, 0, BF16)
            o2 = _decode_one(w, s2, 14, 3, 0, BF16)
            o3 = _decode_one(w, s2, 30, 19, 0, BF16)
            o4 = _decode_one(w, s2, 13, 0, 1, BF16)
            o5 = _decode_one(w, s2, 29, 16, 1, BF16)
            o6 = _decode_one(w, s2, 12, 6, 1, BF16)
            o7 = _decode_one(w, s2, 28, 22, 1, BF16)
        return o0, o1, o2, o3, o4, o5, o6, o7

    @triton.jit
    def _scale_pairs(sc, SCALE_KIND: tl.constexpr, BF16: tl.constexpr):
        """Loaded scales (one entry per 32 columns) -> int32 holding the MMA-dtype scale pair for the asm."""
        if SCALE_KIND == 0:
            # NVFP4: int16 = two e5m3 bytes (group 2b low, 2b + 1 high). fp16 bits (q << 7) + (5 << 10) are the
            # scale itself; bf16 bits (q << 4) + (181 << 7) are the scale * 2**64.
            x = sc.to(tl.int32) & 0xFFFF
            lo = x & 0xFF
            hi = x >> 8
            if BF16:
                lo = (lo << 4) + (181 << 7)
                hi = (hi << 4) + (181 << 7)
            else:
                lo = (lo << 7) + (5 << 10)
                hi = (hi << 7) + (5 << 10)
        else:
            # MXFP4: uint8 s' = s - d with s' <= 128. bf16 bits of 2**(s' - 1); fp16 bits of 2**(s' - 113)
            # (flushed to 0 below fp16's normal range).
            s = sc.to(tl.int32)
            if BF16:
                lo = (s + 126) << 7
            else:
                lo = tl.where(s >= 99, (s - 98) << 10, 0)
            hi = lo
        return lo | (hi << 16)

    @triton.jit
    def _decode_tile(wq, sc, BN: tl.constexpr, BK: tl.constexpr, SCALE_KIND: tl.constexpr, BF16: tl.constexpr,
                     USE_ASM: tl.constexpr):
        """[BN, BK // 8] words + [BN, BK // 32] scales -> [BN, BK] weights times 2**-14 (fp16) / 2**-62 (bf16).

        The pure-Triton path (USE_ASM False) returns float32 in bf16 mode (same values)."""
        NC: tl.constexpr = BK // 128
        wq = tl.reshape(wq, [BN, NC, 4, 4])                      # [n, chunk, c, b]
        sc = tl.broadcast_to(tl.reshape(sc.to(tl.int16), [BN, NC, 1, 4]), [BN, NC, 4, 4])
        o0, o1, o2, o3, o4, o5, o6, o7 = _decode_words(wq, sc, SCALE_KIND, BF16, USE_ASM)
        w = tl.join(tl.join(tl.join(o0, o1), tl.join(o2, o3)), tl.join(tl.join(o4, o5), tl.join(o6, o7)))
        # dims [n, chunk, c, b, r, q0, q1] -> [n, chunk, b, q1, q0, c, r]: column 32b + 8q + 2c + r
        w = tl.permute(w, (0, 1, 3, 6, 5, 2, 4))
        return tl.reshape(w, [BN, BK])

    @triton.jit
    def _epilogue(acc, os_ptr, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, t_ptr, lb_ptr, res_ptr, stride_t, stride_res,
                  HAS_BIAS: tl.constexpr, HAS_LORA: tl.constexpr, R: tl.constexpr, HAS_RES: tl.constexpr,
                  IEEE: tl.constexpr):
        # os_ptr: this MMA dtype's row of the per-row factors (already offset to the tile's segment)
        out = acc * tl.load(os_ptr + rn, mask=rn < N, other=0.0)[:, None]   # [BN, BM] fp32
        if HAS_BIAS:
            out += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
        mask = (rn < N)[:, None] & (rm < M)[None, :]
        if HAS_LORA:  # + (t @ B^T)^T: B [N, R] (scaled), t [M, R], one small MMA per tile
            rr = tl.arange(0, R)
            bt = tl.load(lb_ptr + rn[:, None] * R + rr[None, :], mask=(rn < N)[:, None], other=0.0)   # [BN, R]
            tt = tl.load(t_ptr + rm[None, :] * stride_t + rr[:, None], mask=(rm < M)[None, :], other=0.0)  # [R, BM]
            if IEEE:
                out += tl.dot(bt.to(tl.float32), tt.to(tl.float32), input_precision="ieee")
            else:
                out += tl.dot(bt, tt)
        if HAS_RES:  # + the residual stream: the output is the new hidden state
            out += tl.load(res_ptr + rm[None, :] * stride_res + rn[:, None], mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], out.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["M", "M_BUCKET"])
    def _fp4_gemm(
            # pointers
            x_ptr, w_ptr, s_ptr, out_scale_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, seg_ptr, t_ptr, lb_ptr, res_ptr,
            # sizes (KW: padded K, a multiple of BK; M_BUCKET only keys the autotuner)
            M, N, K, KW, M_BUCKET,
            # strides (elements)
            stride_xm, stride_wn, stride_sn, stride_ym, stride_os, stride_t, stride_res,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
            STREAM_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
            CPS: tl.constexpr, EVEN_K: tl.constexpr, SEGMENTED: tl.constexpr, HAS_LORA: tl.constexpr,
            R: tl.constexpr, HAS_RES: tl.constexpr):
        """y[M, N] = x[M, K] @ W[N, K]^T * out_scale (+ bias) (+ t @ B^T) (+ residual), computed as y^T tiles
        [BN, BM] = W_tile @ x^T. SEGMENTED: W is several separately allocated weights (SegmentedFP4); the tile's
        128-row block looks up the element offsets of its member's words, scales and per-row factors in seg_ptr."""
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        k_steps = KW // BK
        total = tiles_m * tiles_n * k_steps
        if STREAM_K:
            per = tl.cdiv(total, tl.num_programs(0))
        else:
            per = k_steps
        u0 = pid * per
        u1 = tl.minimum(u0 + per, total)
        t_first = u0 // k_steps
        t_last = (u1 - 1) // k_steps
        out_scale = out_scale_ptr + BF16 * stride_os
        rbn = tl.arange(0, BN)
        rbm = tl.arange(0, BM)
        rw = tl.arange(0, BK // 8)
        rs = tl.arange(0, BK // 32)
        rk = tl.arange(0, BK)
        RED: tl.constexpr = max(1, 4096 // (BN * BM))  # partial tiles per reduction load (<= 32 fp32 regs)
        for t in range(t_first, t_last + 1):
            ks0 = tl.maximum(u0 - t * k_steps, 0)
            ks1 = tl.minimum(u1 - t * k_steps, k_steps)
            # grouped tile order: GROUP_M m-tiles share each W tile while it is in L2
            in_group = GROUP_M * tiles_n
            first_m = (t // in_group) * GROUP_M
            group_m = tl.minimum(tiles_m - first_m, GROUP_M)
            pid_m = first_m + (t % in_group) % group_m
            pid_n = (t % in_group) // group_m
            rn = pid_n * BN + rbn
            rm = pid_m * BM + rbm
            if SEGMENTED:  # offsets of this 128-row block's member (multiples of 16 elements: checked on the host)
                seg = seg_ptr + ((pid_n * BN) // 128) * 3
                w_base = w_ptr + tl.multiple_of(tl.load(seg), 16)
                s_base = s_ptr + tl.multiple_of(tl.load(seg + 1), 16)
                os_tile = out_scale + tl.load(seg + 2)
            else:
                w_base = w_ptr
                s_base = s_ptr
                os_tile = out_scale
            w_ptrs = w_base + rn[:, None] * stride_wn + rw[None, :]
            s_ptrs = s_base + rn[:, None] * stride_sn + rs[None, :]
            x_ptrs = x_ptr + rm[None, :] * stride_xm + rk[:, None]
            m_ok = rm[None, :] < M
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            for ks in range(ks0, ks1):
                k0 = ks * BK
                wq = tl.load(w_ptrs + k0 // 8)
                sc = tl.load(s_ptrs + k0 // 32)
                if EVEN_K:  # K % BK == 0: only the (loop-invariant) row mask
                    xt = tl.load(x_ptrs + k0, mask=m_ok, other=0.0)
                else:
                    xt = tl.load(x_ptrs + k0, mask=m_ok & (rk[:, None] < K - k0), other=0.0)
                w = _decode_tile(wq, sc, BN, BK, SCALE_KIND, BF16, USE_ASM)
                if USE_ASM:
                    acc = tl.dot(w, xt, acc)
                else:  # reference path (interpreter: no bf16 matmul); exact operands, fp32 products
                    acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
            if (ks0 == 0) & (ks1 == k_steps):
                _epilogue(acc, os_tile, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, t_ptr, lb_ptr, res_ptr, stride_t,
                          stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, not USE_ASM)
            else:
                # Stream-K partial tile: park it, count arrivals; the last arrival sums all parts in CTA order.
                slot = pid * 2 + (t != t_first).to(tl.int32)
                ws_tile = rbn[:, None] * BM + rbm[None, :]
                tl.store(ws_ptr + slot * (BN * BM) + ws_tile, acc, mask=m_ok)
                # CTA barrier, then one thread's gpu-scope acq_rel arrival (release is cumulative over the CTA's
                # stores, as in CUTLASS's semaphore); the winner's threads read after the broadcast barrier.
                tl.debug_barrier()
                arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
                first_cta = (t * k_steps) // per
                last_cta = ((t + 1) * k_steps - 1) // per
                if arrived == last_cta - first_cta:
                    tot = tl.zeros([BN, BM], dtype=tl.float32)
                    # RED parts per load, so the reduction costs one L2 latency per RED parts, not per part
                    for p0 in range(first_cta, last_cta + 1, RED):
                        rp = p0 + tl.arange(0, RED)
                        p_slot = rp * 2 + (t != (rp * per) // k_steps).to(tl.int32)
                        part = tl.load(ws_ptr + p_slot[:, None, None] * (BN * BM) + ws_tile[None, :, :],
                                       mask=(rp <= last_cta)[:, None, None] & m_ok[None, :, :], other=0.0,
                                       cache_modifier=".cg")
                        tot += tl.sum(part, axis=0)
                    _epilogue(tot, os_tile, bias_ptr, y_ptr, rn, rm, M, N, stride_ym, t_ptr, lb_ptr, res_ptr,
                              stride_t, stride_res, HAS_BIAS, HAS_LORA, R, HAS_RES, not USE_ASM)
                    tl.atomic_xchg(cnt_ptr + t, 0)

    @triton.jit
    def _fp4_dequant(
            # pointers
            w_ptr, s_ptr, out_scale_ptr, o_ptr,
            # sizes
            N, K,
            # strides
            stride_wn, stride_sn, stride_on, stride_os,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, USE_ASM: tl.constexpr, BN: tl.constexpr,
            BK: tl.constexpr):
        """W[N, K] (fp16/bf16, natural layout) from the prepared weight."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BN + tl.arange(0, BN)
        wq = tl.load(w_ptr + rn[:, None] * stride_wn + pid_k * (BK // 8) + tl.arange(0, BK // 8)[None, :])
        sc = tl.load(s_ptr + rn[:, None] * stride_sn + pid_k * (BK // 32) + tl.arange(0, BK // 32)[None, :])
        w = _decode_tile(wq, sc, BN, BK, SCALE_KIND, BF16, USE_ASM)
        w = (w.to(tl.float32) * tl.load(out_scale_ptr + BF16 * stride_os + rn)[:, None]).to(o_ptr.dtype.element_ty)
        rk = pid_k * BK + tl.arange(0, BK)
        tl.store(o_ptr + rn[:, None] * stride_on + rk[None, :], w, mask=(rn < N)[:, None] & (rk < K)[None, :])

    @triton.jit(do_not_specialize=["M"])
    def _fp4_gemm_t(
            # pointers
            g_ptr, w_ptr, s_ptr, out_scale_ptr, o_ptr, ws_ptr, cnt_ptr,
            # sizes: g [M, N] (N = weight rows), o [M, K]; NP: padded rows; KW: padded K; M_BUCKET keys the tuner
            M, N, K, NP, KW, M_BUCKET,
            # strides (elements)
            stride_gm, stride_wn, stride_sn, stride_om, stride_os,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, USE_ASM: tl.constexpr, ROW_SCALE: tl.constexpr,
            BM: tl.constexpr, BKO: tl.constexpr, BNR: tl.constexpr, SPLIT_X: tl.constexpr):
        """o[M, K] = g[M, N] @ W[N, K] (the backward input gradient), as o^T tiles [BKO, BM] = W_tile^T @ g^T.

        Grid (K_pad // BKO, S, cdiv(M, BM)): program (k, s, m) decodes a [BNR, BKO] weight tile per step over the
        s-th of S row ranges of W (the reduction), with the forward's decoder (SPLIT_X only sizes the grid). S > 1:
        fp32 partial tiles go to a workspace and the last program of a column block (arrival counter) sums them in
        split order, so the result is deterministic. ROW_SCALE (groups, whose rows carry different factors): each BNR-row block is scaled by
        its own factor (a block never straddles two members: they are padded to 128 rows); otherwise the one
        factor is applied to the fp32 result.
        """
        pid_k = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        n_split = tl.num_programs(1)
        rows = tl.cdiv(tl.cdiv(NP, n_split), BNR) * BNR     # a trailing split may be empty: it adds zeros
        r0 = pid_s * rows
        r1 = tl.minimum(r0 + rows, NP)
        os_row = out_scale_ptr + BF16 * stride_os
        rw = pid_k * (BKO // 8) + tl.arange(0, BKO // 8)
        rs = pid_k * (BKO // 32) + tl.arange(0, BKO // 32)
        rm = pid_m * BM + tl.arange(0, BM)
        rb = tl.arange(0, BNR)
        m_ok = rm[None, :] < M
        acc = tl.zeros([BKO, BM], dtype=tl.float32)
        for n0 in range(r0, r1, BNR):
            rn = n0 + rb
            wq = tl.load(w_ptr + rn[:, None] * stride_wn + rw[None, :])
            sc = tl.load(s_ptr + rn[:, None] * stride_sn + rs[None, :])
            gt = tl.load(g_ptr + rm[None, :] * stride_gm + rn[:, None], mask=m_ok & (rn[:, None] < N), other=0.0)
            w = _decode_tile(wq, sc, BNR, BKO, SCALE_KIND, BF16, USE_ASM)            # [BNR, BKO]
            if ROW_SCALE:
                if USE_ASM:
                    part = tl.dot(tl.trans(w), gt)
                else:
                    part = tl.dot(tl.trans(w.to(tl.float32)), gt.to(tl.float32), input_precision="ieee")
                acc += part * tl.load(os_row + n0)
            else:
                if USE_ASM:
                    acc = tl.dot(tl.trans(w), gt, acc)
                else:
                    acc = tl.dot(tl.trans(w.to(tl.float32)), gt.to(tl.float32), acc, input_precision="ieee")
        if not ROW_SCALE:
            acc = acc * tl.load(os_row)
        rk = pid_k * BKO + tl.arange(0, BKO)
        o_ptrs = o_ptr + rm[None, :] * stride_om + rk[:, None]
        o_mask = m_ok & (rk[:, None] < K)
        if n_split == 1:
            tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=o_mask)
        else:
            tile = pid_m * tl.num_programs(0) + pid_k
            ws_tile = tl.arange(0, BKO)[:, None] * BM + tl.arange(0, BM)[None, :]
            tl.store(ws_ptr + (tile * n_split + pid_s) * (BKO * BM) + ws_tile, acc)
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == n_split - 1:
                tot = tl.zeros([BKO, BM], dtype=tl.float32)
                for p in range(0, n_split):
                    tot += tl.load(ws_ptr + (tile * n_split + p) * (BKO * BM) + ws_tile, cache_modifier=".cg")
                tl.store(o_ptrs, tot.to(o_ptr.dtype.element_ty), mask=o_mask)
                tl.atomic_xchg(cnt_ptr + tile, 0)

    @triton.jit(do_not_specialize=["M", "M_BUCKET"])
    def _fp4_gemm_tc(
            # pointers (a: x for the forward, grad_y for the backward)
            a_ptr, w_ptr, s_ptr, out_scale_ptr, bias_ptr, o_ptr, seg_ptr, t_ptr, lb_ptr, res_ptr,
            # sizes: o [M, NO] = a [M, KR] @ op(W); RP: the reduction length padded (K_pad or N_pad); WB: the
            # bound of the decoded tile's other side (forward: N_pad rows; backward: K_pad columns)
            M, NO, KR, RP, WB, M_BUCKET,
            # strides (elements)
            stride_am, stride_wn, stride_sn, stride_om, stride_os, stride_t, stride_res,
            # meta
            SCALE_KIND: tl.constexpr, BF16: tl.constexpr, HAS_BIAS: tl.constexpr, USE_ASM: tl.constexpr,
            FORWARD: tl.constexpr, SEGMENTED: tl.constexpr, HAS_LORA: tl.constexpr, R: tl.constexpr,
            HAS_RES: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
            TC_FWD: tl.constexpr = 1, TC_BWD: tl.constexpr = 1):
        """Tensor-core tiles for M >= 64 in the natural orientation: o tile [BM, BN] = a tile [BM, BK] @ B,
        B the weight tile decoded in registers and handed to the MMA through shared memory (Triton stages it).

        FORWARD: o = x @ W^T (NO = N, KR = K): B = decode(W[n-block, k-chunk])^T, per-column factors and bias in
        the epilogue. Backward (FORWARD False): o = grad_y @ W (NO = K, KR = N): B = decode(W[n-chunk, k-block]),
        one factor for the whole weight (single weights only). The decode is the stream-K kernel's (same layout,
        same bit operations), amortised over BM rows of activations instead of 16-64. Forward only: SEGMENTED
        (SegmentedFP4, BN <= 128), a LoRA update and the residual in the epilogue, as `_fp4_gemm`."""
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(NO, BN)
        in_group = GROUP_M * tiles_n
        first_m = (pid // in_group) * GROUP_M
        group_m = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % group_m
        pid_n = (pid % in_group) // group_m
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        m_ok = rm < M
        out_scale = out_scale_ptr + BF16 * stride_os
        w_base = w_ptr
        s_base = s_ptr
        if SEGMENTED:  # this 128-row block's member (see _fp4_gemm)
            seg = seg_ptr + ((pid_n * BN) // 128) * 3
            w_base = w_ptr + tl.multiple_of(tl.load(seg), 16)
            s_base = s_ptr + tl.multiple_of(tl.load(seg + 1), 16)
            out_scale = out_scale + tl.load(seg + 2)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
        if FORWARD:
            w_ok = (rn < WB)[:, None]
            w_ptrs = w_base + rn[:, None] * stride_wn + tl.arange(0, BK // 8)[None, :]
            s_ptrs = s_base + rn[:, None] * stride_sn + tl.arange(0, BK // 32)[None, :]
        else:
            w_ok = (pid_n * BN + tl.arange(0, BN // 8) * 8 < WB)[None, :]
            w_ptrs = w_ptr + rk[:, None] * stride_wn + pid_n * (BN // 8) + tl.arange(0, BN // 8)[None, :]
            s_ptrs = s_ptr + rk[:, None] * stride_sn + pid_n * (BN // 32) + tl.arange(0, BN // 32)[None, :]
        for r0 in range(0, RP, BK):
            a = tl.load(a_ptrs + r0, mask=m_ok[:, None] & (rk[None, :] < KR - r0), other=0.0)
            if FORWARD:
                wq = tl.load(w_ptrs + r0 // 8, mask=w_ok, other=0)
                sc = tl.load(s_ptrs + r0 // 32, mask=w_ok, other=0)
                w = tl.trans(_decode_tile(wq, sc, BN, BK, SCALE_KIND, BF16, USE_ASM))       # [BK, BN]
            else:
                wq = tl.load(w_ptrs + r0 * stride_wn, mask=w_ok, other=0)
                sc = tl.load(s_ptrs + r0 * stride_sn, mask=(pid_n * BN + tl.arange(0, BN // 32) * 32 < WB)[None, :],
                             other=0)
                w = _decode_tile(wq, sc, BK, BN, SCALE_KIND, BF16, USE_ASM)                 # [BK, BN]
            if USE_ASM:
                acc = tl.dot(a, w, acc)
            else:  # reference path (interpreter: no bf16 matmul); exact operands, fp32 products
                acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        o_mask = m_ok[:, None] & (rn < NO)[None, :]
        if FORWARD:
            out = acc * tl.load(out_scale + rn, mask=rn < NO, other=0.0)[None, :]
            if HAS_BIAS:
                out += tl.load(bias_ptr + rn, mask=rn < NO, other=0.0).to(tl.float32)[None, :]
            if HAS_LORA:
                rr = tl.arange(0, R)
                tt = tl.load(t_ptr + rm[:, None] * stride_t + rr[None, :], mask=m_ok[:, None], other=0.0)  # [BM, R]
                bt = tl.load(lb_ptr + rn[None, :] * R + rr[:, None], mask=(rn < NO)[None, :], other=0.0)   # [R, BN]
                if USE_ASM:
                    out += tl.dot(tt, bt)
                else:
                    out += tl.dot(tt.to(tl.float32), bt.to(tl.float32), input_precision="ieee")
            if HAS_RES:
                out += tl.load(res_ptr + rm[:, None] * stride_res + rn[None, :], mask=o_mask, other=0.0).to(tl.float32)
        else:
            out = acc * tl.load(out_scale)
        tl.store(o_ptr + rm[:, None] * stride_om + rn[None, :], out.to(o_ptr.dtype.element_ty), mask=o_mask)

    # ----------------------------------------------------------------------------------------------------------
    # Tuning
    # ----------------------------------------------------------------------------------------------------------
    def _gemm_configs():
        """Candidate configs for every M bucket; `_prune` keeps those that fit the call.

        Why these values (measured on an H200 with kernels/tune.py; 132 SMs, 228 KB shared memory per SM):
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
        fwd, seg = kwargs.get("FORWARD", True), kwargs.get("SEGMENTED", False)
        keep = []
        for c in configs:
            kv = c.kwargs
            if fwd and kv["TC_FWD"] and (kv["BN"] <= 128 or not seg):
                keep.append(c)
            elif not fwd and kv["TC_BWD"]:
                keep.append(c)
        return keep

    _fp4_gemm_tc_tuned = triton.autotune(
        configs=_tc_configs(), key=["M_BUCKET", "NO", "KR", "SCALE_KIND", "BF16", "HAS_BIAS", "FORWARD", "SEGMENTED"],
        prune_configs_by={"early_config_prune": _prune_tc}, do_bench=_bench)(_fp4_gemm_tc)


def _bucket_bm_t(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


# --------------------------------------------------------------------------------------------------------------
# Wrappers
# --------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


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


def _check_2d(x: torch.Tensor, w: PreparedFP4, cols: int, op: str, name: str) -> None:
    """x must be [M, cols], float16/bfloat16, on the weight's device; errors name the op and the argument."""
    if x.dim() != 2 or x.shape[1] != cols:
        raise ValueError(f"{op}: expected {name} of shape [M, {cols}], got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"{op}: {name} must be float16 or bfloat16, got {x.dtype}")
    if x.device != w.words.device:
        raise ValueError(f"{op}: {name} on {x.device} but the weight on {w.words.device}")


def fp4_gemm(x: torch.Tensor, w, bias: torch.Tensor | None = None, *, config: dict | None = None,
             fused: bool | None = None, path: str | None = None, lora: tuple | None = None,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) (+ t @ B^T) (+ residual) with fp32 accumulation, output in x's dtype.

    Args:
        x: [M, K] float16/bfloat16, on the weight's device (CUDA, or CPU under TRITON_INTERPRET=1).
        w: the prepared weight (PreparedFP4, a `concat_prepared` group, or a `segment_prepared` SegmentedFP4).
        bias: optional [N].
        config: force one kernel config (dict of STREAM_K, BM, BN, BK, GROUP_M, CPS, num_warps, num_stages)
            instead of autotuning; the interpreter always uses a small fixed one.
        fused: force the stream-K / tiled swap-AB kernel (True) or dequantize + cuBLAS (False).
        path: force "swap" (that kernel), "tc" (`fp4_gemm_tc`, the tensor-core tiles) or "deq" (dequantize +
            cuBLAS). Default: "swap" for M <= 64; above, the fastest of the candidates (swap up to FUSED_MAX_M,
            tc up to TC_MAX_M, deq) as timed on first use per shape and M bucket (`_choose_path`).
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
    seg = isinstance(w, SegmentedFP4)
    if lora is not None:
        t, lb = lora
        if seg or t.shape != (m, lb.shape[1]) or lb.shape[0] < w.n or not lb.is_contiguous() or \
                lb.shape[1] < 16 or lb.shape[1] & (lb.shape[1] - 1):
            raise ValueError(f"fp4_gemm: LoRA t {tuple(t.shape)} / B {tuple(lb.shape)} do not fit x [{m}, {w.k}] "
                             f"and a single weight of {w.n} rows (B contiguous, rank a power of two >= 16)")
    if residual is not None and tuple(residual.shape) != (m, w.n):
        raise ValueError(f"fp4_gemm: residual {tuple(residual.shape)} is not [{m}, {w.n}]")
    if path is None:
        path = {True: "swap", False: "deq"}.get(fused) or _choose_path(x, w, bias)
    if path == "tc":
        return fp4_gemm_tc(x, w, bias, lora=lora, residual=residual, config=config)
    if path == "deq":
        if seg:
            y = x.new_zeros((m, w.n))
            for (row, n), p in zip(w.parts, w.members):
                y[:, row:row + n] = torch.nn.functional.linear(x, fp4_dequantize(p, x.dtype))
            if bias is not None:
                y += bias
        else:
            y = torch.nn.functional.linear(x, fp4_dequantize(w, x.dtype), bias)
        if lora is not None:
            y.addmm_(lora[0], lora[1][:w.n].t())
        if residual is not None:
            y += residual
        return y
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
    seg_arg = w.table[int(bf16)] if seg else dummy
    args = (x, w.words, w.scales, w.out_scales, bias_arg, y, ws, cnt, seg_arg, t_arg, lb_arg, res_arg,
            m, w.n, w.k, kw, _bucket_m(m),
            x.stride(0), w.words.stride(0), w.scales.stride(0), y.stride(0), 0 if seg else w.out_scales.stride(0),
            t_arg.stride(0), res_arg.stride(0))
    use_asm = (not interp) if USE_ASM_OVERRIDE is None else USE_ASM_OVERRIDE
    meta = dict(SCALE_KIND=w.scale_kind, BF16=bf16, HAS_BIAS=bias is not None, USE_ASM=use_asm, SEGMENTED=seg,
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
        c = dict(config)
        nw, ns = c.pop("num_warps", 4), c.pop("num_stages", 3)
        _fp4_gemm[grid(c)](*args, **meta, **c, EVEN_K=w.k % c["BK"] == 0, num_warps=nw, num_stages=ns)
    else:
        _fp4_gemm_tuned[grid](*args, **meta)
    return y


TC_MAX_M = int(os.environ.get("QERL_FP4_TC_MAX_M", "16384"))
# The tensor-core tiles are a dispatch candidate only on request: on an H200 (results/measured/h200/
# kernels.run4.*) they ran 0.31-0.51x bf16 forward and 2-5.8x slower backward at every M (ncu: one CTA of 4-8
# warps per SM, 80 % of issue slots without an eligible warp), so timing them on first use only costs compiles.
TC_IN_DISPATCH = os.environ.get("QERL_FP4_TC", "0") not in ("", "0")
_DISPATCH: dict = {}


def _choose_path(x: torch.Tensor, w, bias) -> str:
    """"swap" for M <= FUSED_MIN_TRY; above, the fastest candidate timed once per shape and M bucket (do_bench
    of the bare product, no LoRA / residual). Interpreter, CPU and graph capture: the first candidate."""
    m = x.shape[0]
    if m <= FUSED_MIN_TRY:
        return "swap"
    cands = (["swap"] if m <= FUSED_MAX_M else []) + (["tc"] if TC_IN_DISPATCH and m <= TC_MAX_M else []) + ["deq"]
    key = (w.n, w.k, _bucket_m(m), x.dtype, w.scale_kind, isinstance(w, SegmentedFP4), x.device.index)
    if key not in _DISPATCH:
        if interpret_mode() or not x.is_cuda or torch.cuda.is_current_stream_capturing():
            return cands[0]
        times = {p: _time_or_inf(lambda p=p: fp4_gemm(x, w, bias, path=p), p) for p in cands}
        _DISPATCH[key] = min(times, key=times.get)
    return _DISPATCH[key]


def _time_or_inf(fn, name: str) -> float:
    """do_bench milliseconds of fn, or inf (with a message) if it cannot compile or run on this device."""
    try:
        return triton.testing.do_bench(fn, warmup=5, rep=25)
    except Exception as e:  # noqa: BLE001 - a path that does not compile here is simply not chosen
        print(f"kernels: path {name!r} unavailable: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return float("inf")


def dispatch_table() -> dict:
    """The paths chosen so far: {(n, k, M bucket, dtype, format, segmented, device): path} (for benchmarks)."""
    return dict(_DISPATCH)


def fp4_gemm_tc(a: torch.Tensor, w, bias: torch.Tensor | None = None, *, forward: bool = True,
                lora: tuple | None = None, residual: torch.Tensor | None = None,
                config: dict | None = None) -> torch.Tensor:
    """The tensor-core tiles (`_fp4_gemm_tc`): forward y = a @ W^T (+ bias, LoRA, residual as `fp4_gemm`), or
    backward (forward=False) grad_x = a @ W for a single weight; for M >= 64 or so.

    Args:
        a: [M, K] (forward) or [M, w.n] (backward), float16/bfloat16, on the weight's device.
        w: PreparedFP4 (forward: also groups and SegmentedFP4; backward: single weights).
        config: force one config (dict of BM, BN, BK, GROUP_M, num_warps, num_stages).

    Returns:
        [M, w.n] (forward) or [M, w.k] (backward).

    Raises:
        ValueError: shape, dtype or device mismatch, or a group / extras in the backward.
    """
    seg = isinstance(w, SegmentedFP4)
    if forward:
        _check_2d(a, w, w.k, "fp4_gemm_tc", "x")
        no, kr, rp = w.n, w.k, w.words.shape[1] * 8
        wb = sum(p.words.shape[0] for p in w.members) if seg else w.words.shape[0]
    else:
        _check_2d(a, w, w.n, "fp4_gemm_tc", "grad")
        if seg or w.row_scale or lora is not None or residual is not None or bias is not None:
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
            w.table[int(a.dtype == torch.bfloat16)] if seg else dummy, t_arg, lb_arg, res_arg,
            m, no, kr, rp, wb, _bucket_m(m),
            a.stride(0), w.words.stride(0), w.scales.stride(0), o.stride(0), 0 if seg else w.out_scales.stride(0),
            t_arg.stride(0), res_arg.stride(0))
    use_asm = (not interp) if USE_ASM_OVERRIDE is None else USE_ASM_OVERRIDE
    meta = dict(SCALE_KIND=w.scale_kind, BF16=a.dtype == torch.bfloat16, HAS_BIAS=bias is not None,
                USE_ASM=use_asm, FORWARD=forward, SEGMENTED=seg, HAS_LORA=lora is not None,
                R=lora[1].shape[1] if lora is not None else 16, HAS_RES=residual is not None)

    def grid(c):
        return (-(-m // c["BM"]) * -(-no // c["BN"]),)

    if config is not None:
        c = dict(config)
        nw, ns = c.pop("num_warps", 4), c.pop("num_stages", 3)
        _fp4_gemm_tc[grid(c)](*args, **meta, **c, num_warps=nw, num_stages=ns)
    else:
        _fp4_gemm_tc_tuned[grid](*args, **meta)
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
_DISPATCH_T: dict = {}


def fp4_gemm_t(g: torch.Tensor, w: PreparedFP4, *, config: dict | None = None,
               fused: bool | None = None, path: str | None = None) -> torch.Tensor:
    """grad_x = g @ W (the backward input gradient of y = x @ W^T), fp32 accumulation, output in g's dtype.

    Args:
        g: [M, n] float16/bfloat16 (n = w.n; for a group, the rows of all members, padding included).
        w: the prepared weight or group.
        config: force one config (dict of BM, BKO, BNR, SPLIT_X, num_warps, num_stages) instead of autotuning.
        fused: force the fused transposed kernel (True) or dequantize + cuBLAS (False).
        path: force "swap" (that kernel), "tc" (`fp4_gemm_tc(forward=False)`, single weights) or "deq". Default:
            "swap" for M <= 64; above, the fastest of swap (up to BWD_FUSED_MAX_M), tc (single weights, up to
            TC_MAX_M) and deq, timed on first use per shape and M bucket.
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
    use_asm = (not interp) if USE_ASM_OVERRIDE is None else USE_ASM_OVERRIDE
    bf16 = g.dtype == torch.bfloat16
    args = (g, w.words, w.scales, w.out_scales, o, ws, cnt, m, w.n, w.k, n_pad, kw, _bucket_m(m),
            g.stride(0), w.words.stride(0), w.scales.stride(0), o.stride(0), w.out_scales.stride(0))
    meta = dict(SCALE_KIND=w.scale_kind, BF16=bf16, USE_ASM=use_asm, ROW_SCALE=w.row_scale)

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

    if config is not None:
        c = dict(config)
        nw, ns = c.pop("num_warps", 4), c.pop("num_stages", 3)
        _fp4_gemm_t[grid(c)](*args, **meta, **c, num_warps=nw, num_stages=ns)
    else:
        _fp4_gemm_t_tuned[grid](*args, **meta)
    return o


def _choose_path_t(g: torch.Tensor, w: PreparedFP4) -> str:
    """The backward's `_choose_path`: "swap" up to BWD_FUSED_MIN_TRY, else the fastest candidate, timed once."""
    m = g.shape[0]
    if m <= BWD_FUSED_MIN_TRY:
        return "swap"
    cands = (["swap"] if m <= BWD_FUSED_MAX_M else []) + \
        (["tc"] if TC_IN_DISPATCH and m <= TC_MAX_M and not w.row_scale else []) + ["deq"]
    key = ("t", w.n, w.k, _bucket_m(m), g.dtype, w.scale_kind, w.row_scale, g.device.index)
    if key not in _DISPATCH:
        if interpret_mode() or not g.is_cuda or torch.cuda.is_current_stream_capturing():
            return cands[0]
        times = {p: _time_or_inf(lambda p=p: fp4_gemm_t(g, w, path=p), p) for p in cands}
        _DISPATCH[key] = min(times, key=times.get)
    return _DISPATCH[key]
