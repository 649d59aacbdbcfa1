"""FP4 (NVFP4 / MXFP4) weights in the kernels' load-time layout, and the plain-torch references over that layout.

The one idea: the form in which the Triton W4A16 kernels (fp4_triton.py) read a 4-bit weight, built ONCE
per weight at load time by nvfp4.prepare / mxfp4.prepare, with its inverse and exact torch references (for tests and
CPU callers). No Triton here: this module, and the torch reference path over it, work without it.

1. `prepare_codes`: every 32-bit word holds the 8 codes that one GPU thread needs for its wgmma A-operand fragment
   (k = 32b + 8q + 2c + r for lane-quad c, word b, q = 0..3, r = 0..1), with the nibble bits placed so that each
   pair of codes becomes an fp16x2/bf16x2 register in 2-4 integer instructions (11 per word for fp16, 13 for bf16,
   found by exhaustive search over shift/mask layouts; the decoder is fp4_decoder.py). A thread loads its 4
   words of a 128-wide k chunk with one 16-byte shared-memory load, and Triton's layout propagation maps the decoded
   tile onto the MMA operand layout with no data exchange between threads. Rows are padded to ROW_ALIGN, columns to
   CHUNK (`padded_shape`); `unprepare_codes` is the inverse.
2. NVFP4 scales are stored re-encoded as "e5m3" bytes (value 2**(e5 - 10) * (1 + m3 / 8), `e4m3_to_e5m3`) so that
   two of them become an fp16x2 or bf16x2 register with one shift-add.
3. Per-row output factors (`out_scales` [2, N_pad], `row_out_scales`) let several weights of one K run as one launch
   (`concat_prepared`: q/k/v, gate/up), each with its own per-tensor scale; `stacked_view` gives the same group
   without a copy when the members already are consecutive rows of one allocation.
4. `PreparedCache`: prepared weights cached on the storage tensors, for callers that keep passing the storage layout.

References: `dequantize_prepared_reference` is bit-identical to the formats' reference dequantization (float32 math).
`interpret_mode()`: whether Triton runs in its CPU interpreter (TRITON_INTERPRET=1).
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import torch

from qerl_kernels.reference import E2M1_VALUES, pack_codes, unpack_codes

__all__ = [
    "CHUNK", "ROW_ALIGN", "PreparedFP4", "PreparedCache", "prepare_codes", "unprepare_codes", "padded_shape",
    "row_out_scales", "concat_prepared", "stacked_view", "e4m3_to_e5m3", "e5m3_to_float",
    "dequantize_prepared_reference", "interpret_mode",
]

CHUNK = 128      # k elements per storage chunk (16 words per row)
ROW_ALIGN = 128  # rows padded to a multiple of this (largest BN)

# Bit positions of pair q (codes j = 2q and 2q + 1 of a word; +16 for the second of the pair):
# sign bit and the low bit of the 3-bit exponent/mantissa field. Chosen by exhaustive search (see docstring).
_SIGN_POS = (15, 14, 13, 12)
_EM_POS = (9, 3, 0, 6)


def interpret_mode() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
    (qerl/layers/quant_linear.py) and calling the ops over prepared tensors (qerl_kernels/prepared_ops.py).
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
    members, parts = _group_parts(members, "concat_prepared")
    return PreparedFP4(torch.cat([p.words for p in members]).contiguous(),
                       torch.cat([p.scales for p in members]).contiguous(),
                       torch.cat([p.out_scales for p in members], dim=1).contiguous(),
                       parts[-1][0] + parts[-1][1], members[0].k, members[0].scale_kind, parts)


def stacked_view(members) -> PreparedFP4 | None:
    """The group `concat_prepared(members)` builds, as views and without a copy, when the members' words and scales
    already are consecutive rows of one allocation each (QuantLinear layers after
    `qerl.layers.quant_linear.share_kernel_storage`); None when they are not. Only `out_scales` ([2, N_pad] float32,
    8 bytes a row) is concatenated anew.

    Raises:
        ValueError: members that cannot form a group (as `concat_prepared`).
    """
    members, parts = _group_parts(members, "stacked_view")
    views = []
    for name in ("words", "scales"):
        ts = [getattr(p, name) for p in members]
        base = ts[0]
        at = base.data_ptr()
        for t in ts:
            if not t.is_contiguous() or t.shape[1:] != base.shape[1:] or t.dtype != base.dtype or \
                    t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr() or t.data_ptr() != at:
                return None
            at += t.numel() * t.element_size()
        rows = sum(t.shape[0] for t in ts)
        views.append(base.as_strided((rows, *base.shape[1:]), base.stride()))
    return PreparedFP4(views[0], views[1], torch.cat([p.out_scales for p in members], dim=1).contiguous(),
                       parts[-1][0] + parts[-1][1], members[0].k, members[0].scale_kind, parts)


def _group_parts(members, op: str) -> tuple[list, tuple]:
    """(members as a list, ((first row, rows) of each member in the stacked weight)) after checking they can form a
    group: equal K, format and device, none a group itself."""
    members = list(members)
    if not members:
        raise ValueError(f"{op}: no weights given")
    k, kind, dev = members[0].k, members[0].scale_kind, members[0].words.device
    for p in members:
        if p.k != k or p.scale_kind != kind or p.words.device != dev or p.parts:
            raise ValueError(f"{op}: members must share K, format and device and not be groups; got "
                             f"{[(q.n, q.k, q.scale_kind, str(q.words.device), bool(q.parts)) for q in members]}")
    parts, row = [], 0
    for p in members:
        parts.append((row, p.n))
        row += p.words.shape[0]
    return members, tuple(parts)


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
    c = unpack_codes(codes).to(torch.int64)  # [N, K]
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
    return pack_codes(codes)


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


def dequantize_prepared_reference(w: PreparedFP4, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Plain-torch W [n, k] of a prepared weight (or group: rows of all members, padding rows 0), float32 math.

    Bit-identical to the formats' reference dequantization of the weight(s) it was prepared from: NVFP4
    e2m1 * scale * global_scale, MXFP4 e2m1 * 2**(scale - 127), each product in float32.
    """
    n_pad, k_pad = w.words.shape[0], w.words.shape[1] * 8
    codes = unprepare_codes(w.words, n_pad, k_pad).to(torch.int64)
    vals = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)[unpack_codes(codes)]  # [n_pad, k_pad]
    if w.scale_kind == 0:
        q = w.scales.contiguous().view(torch.uint8)                                      # [n_pad, k_pad // 16]
        blocks = vals.view(n_pad, -1, 16) * e5m3_to_float(q)[..., None]
        row = w.out_scales[1].float() * 2.0 ** -62                                       # = global scale
    else:
        blocks = torch.ldexp(vals.view(n_pad, -1, 32), (w.scales.to(torch.int32) - 127)[..., None].float())
        row = w.out_scales[1].float()                                                    # = 2**d
    out = blocks.reshape(n_pad, k_pad) * row[:, None]
    return out[:w.n, :w.k].to(dtype)
