"""The E2M1 decoder of the FP4 (NVFP4 / MXFP4) kernels: words of the load-time layout (layout.py) and their
block scales -> scaled fp16/bf16 weights, as Triton inline PTX (GPU) and as a pure-Triton twin (the interpreter's
path, and the readable spec). Every kernel in fp4_triton.py decodes through `_decode_tile`.

- Each pair of codes becomes an fp16x2/bf16x2 register in 2-4 integer instructions (11 per word for fp16, 13 for
  bf16), thanks to the bit positions chosen by exhaustive search over shift/mask layouts (layout._SIGN_POS and
  layout._EM_POS, written by `prepare_codes`).
- Block scales are applied with one packed multiply per pair of weights, in the MMA's own precision, and the
  products are exact: e2m1 (2 significant bits) times an E4M3 scale (4 bits) needs 6 bits and stays inside fp16's /
  bf16's range with the biases chosen below; the per-tensor factor is applied once to the fp32 result (by the
  kernels). NVFP4's e5m3 scale bytes become an fp16x2 or bf16x2 register with one shift-add.
- MXFP4 with fp16 activations flushes blocks whose scale is below fp16's normal range to zero (`_scale_pairs`).

CPU: TRITON_INTERPRET=1 runs the same kernels with the pure-Triton decoder instead of the inline PTX
(tests/qerl_kernels). HAVE_TRITON: whether triton imports (it is optional on CPU-only installs; the torch reference path
works without it).
"""
from __future__ import annotations

import re

try:  # triton is optional on CPU-only installs; the torch reference path works without it
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "decode_ptx"]

if HAVE_TRITON:
    _PTX_REGS = ("a1", "a2", "a3", "a6", "a9", "t", "s", "s0", "s1", "h0", "h1", "h2", "h3", "nz", "sl", "sh")

    def decode_ptx(scale_kind: int, bf16: bool, word: str = "$8", scale: str = "$9",
                   sfx: str = "") -> tuple[str, str]:
        """(register declarations, body): PTX that decodes the 32-bit `word` with its raw scale entry `scale` (both
        operand names) into the four scaled fp16x2/bf16x2 pairs h0..h3 (`sfx` appended to every register name, so
        that one asm block can decode several words: fp4_mma.py). Pair h_q holds codes (q, r = 0) low and (q, 1)
        high, i.e. columns 8q + 2c + r of the word's 32 (layout.prepare_codes).

        The scale entry is 16 bits, for the word's 32 columns (NVFP4: two e5m3 bytes, group 2b in byte 0; MXFP4:
        the re-biased E8M0 byte). Pair q has its sign bit at
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
        decl = ".reg .b32 a1, a2, a3, a6, a9, t, s, s0, s1, h0, h1, h2, h3, nz;\n.reg .b16 sl, sh;\n"
        text = sc + "\nmov.b32 {sl, sh}, s;\nmov.b32 s0, {sl, sl};\nmov.b32 s1, {sh, sh};" + dec + "\n"
        names = re.compile(r"\b(" + "|".join(_PTX_REGS) + r")\b")
        decl, text = (names.sub(lambda m: m.group(1) + sfx, z) for z in (decl, text))
        return decl, re.sub(r"\$([89])\b", lambda m: word if m.group(1) == "8" else scale, text)

    def _asm(scale_kind: int, bf16: bool) -> str:
        """PTX for one 32-bit word ($8) and its scale entry ($9) -> 8 scaled fp16/bf16 values $0..$7 (code j = 2q +
        r), as Triton inline asm (`decode_ptx`, then the pairs unpacked)."""
        decl, text = decode_ptx(scale_kind, bf16)
        return ("{\n" + decl + text + "mov.b32 {$0, $1}, h0;\nmov.b32 {$2, $3}, h1;\nmov.b32 {$4, $5}, h2;\n"
                "mov.b32 {$6, $7}, h3;\n}")

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
