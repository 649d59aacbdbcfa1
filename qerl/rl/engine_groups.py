"""A projection group of the decode engine (qerl.rl.engine): the linear layers that read one input (q/k/v, gate/up,
or a single o / down), the frozen bases they read, their stacked LoRA factors, and how the group's output is computed.

The engine does not modify the model's values. A group asks the layers for what it needs through their public API
(`qerl.layers.lora.adapter_factors`, `QuantLinear.kernel_weight`) and keeps its own copies only of what is small:
the LoRA factors (A stacked, B scaled; refreshed at every `generate`, so an optimizer step between generations is
seen), the q/k/v biases and, for BF16 bases, the q/k/v weights concatenated (0.9 GB for Qwen2.5-7B, ~6 % of its
BF16 weights; `copy_dense_qkv=False` runs three GEMMs instead). bitsandbytes NF4 layers marked by
`baselines.nf4.mark_decode_dequantized` (config model.nf4_decode: dequantized) are the exception: the group holds
their dequantized weights, concatenated, and runs them as BF16 bases. 4-bit weights are read in place on CUDA (a
QuantLinear converts its buffers to the kernels' layout, as its own first CUDA forward does), and the members of a
4-bit q/k/v or gate/up group are re-homed once into one allocation (`share_kernel_storage`: the layers' buffers
become row views of it, values unchanged), so the group is an ordinary contiguous operand that every kernel takes
(the wgmma and skinny-M kernels among them) without a second copy of the weights; on the CPU, where the layers are
left as they are, the engine holds a prepared copy of them. A group watches the addresses of the tensors
it reads in place: when the model's tensors were replaced, `refresh` rebuilds it (and the engine drops its captured
CUDA graphs, which read the stale addresses).

Run the tests: ``pytest tests/rl/test_engine.py -q``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from qerl_kernels.decode import lora_down
from qerl_kernels.prepared_ops import fp4_linear_fused

__all__ = ["Group"]


class Group:
    """Linear layers reading one input (q/k/v, gate/up, or a single o / down): one base product for all of them,
    one cuBLAS product for all their LoRA down-projections (t = x A_cat^T), and their LoRA up-projections stacked
    by rows (`lora_b`, scaled, rank padded to R) for the kernel that consumes the outputs.

    Kinds: "fp4" (QuantLinear bases: one prepared group over their own buffers, `share_kernel_storage`, or the single
    prepared weight), "dense" (frozen nn.Linear: the module's weight, or for several members an engine-owned
    concatenation; or bitsandbytes NF4 layers marked for a dequantized decode: their dequantized weights,
    engine-owned), "bases" (other frozen bases, e.g. unmarked bitsandbytes layers: called one by one), "call" (modules
    called as they are, LoRA included: merged or DoRA adapters, several adapters, trainable bases, fuse=False)."""

    def __init__(self, mods, *, fuse: bool, dtype: torch.dtype, in_place: bool, copy_dense: bool,
                 split_rows: int = 0):
        from torch import nn

        from qerl.layers import QuantLinear
        from qerl.layers.lora import adapter_factors
        from qerl.policy.formats import decode_dequantized

        self.mods, self.dtype, self.in_place, self.copy_dense = list(mods), dtype, in_place, copy_dense
        self.split_rows = split_rows  # LoRA down-products of at most this many rows by the split kernel
        facts = [adapter_factors(m) for m in self.mods]
        self.kind, self.lora_b, self.a_cat, self.bias = "call", None, None, None
        self.dequantized = False  # "dense" from bitsandbytes NF4 layers (the engine owns their dequantized weights)
        if not fuse or any(f is None or len(f) > 1 for _, f in facts):
            return
        self.bases = [b for b, _ in facts]
        self.factors = [f[0] if f else None for _, f in facts]
        self.sizes = [int(b.out_features) for b in self.bases]
        frozen = all(not p.requires_grad for b in self.bases for p in b.parameters())
        if len({getattr(b, "in_features", None) for b in self.bases}) != 1 or not frozen:
            return
        if all(isinstance(b, QuantLinear) for b in self.bases) and len({b.fmt for b in self.bases}) == 1:
            self.kind = "fp4"
        elif all(type(b) is nn.Linear for b in self.bases):
            self.kind = "dense"
        elif all(decode_dequantized(b) for b in self.bases):
            self.kind, self.dequantized = "dense", True
        else:
            self.kind = "bases"
        self._build()

    # ---- construction and refresh ------------------------------------------------------------------------------
    def _build(self) -> None:
        import qerl_kernels
        from qerl.layers import share_kernel_storage
        from qerl_kernels.decode import lora_rank_pad

        bases = self.bases
        if self.kind == "fp4":
            if self.in_place and len(bases) > 1:  # the layers' buffers become rows of one allocation, once
                self.w = share_kernel_storage(bases)
                self.members = [b.kernel_weight() for b in bases]
            else:  # a single weight read in place, or (CPU) prepared copies
                self.members = [b.kernel_weight(in_place=self.in_place) for b in bases]
                self.w = self.members[0] if len(bases) == 1 else qerl_kernels.concat_prepared(self.members)
            self.parts = [(0, self.sizes[0])] if len(bases) == 1 else list(self.w.parts)
        elif self.kind == "dense":
            if self.dequantized:  # frozen: dequantized once, until the layers' weights are replaced
                from qerl.policy.formats import dequantized_weight

                self.w = torch.cat([dequantized_weight(b, self.dtype) for b in bases])
            elif len(bases) == 1:
                self.w = bases[0].weight
            elif self.copy_dense:
                self.w = torch.empty(sum(self.sizes), bases[0].in_features, dtype=bases[0].weight.dtype,
                                     device=bases[0].weight.device)
            else:
                self.w = None
            rows = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
            self.parts = list(zip(rows, self.sizes))
        biases = [b.bias for b in bases]
        self.bias = None
        if any(x is not None for x in biases):  # engine-owned [sum n] (a copy: refreshed in refresh())
            ref = next(x for x in biases if x is not None)
            self.bias = torch.zeros(sum(self.sizes), dtype=self.dtype, device=ref.device)
        if any(f is not None for f in self.factors):
            ref = next(f for f in self.factors if f is not None)[0]
            self.r = lora_rank_pad(max(f[0].shape[0] for f in self.factors if f is not None))
            self.a_cat = torch.zeros(self.r * len(bases), ref.shape[1], dtype=self.dtype, device=ref.device)
            self.lora_b = torch.zeros(sum(self.sizes), self.r, dtype=self.dtype, device=ref.device)
        self._ptrs = self._watched()
        self.refresh()

    def _watched(self) -> tuple:
        """Addresses of the model tensors this group reads in place (a change means they were replaced)."""
        if self.kind == "fp4":
            return tuple(t.data_ptr() for p in self.members for t in (p.words, p.scales, p.out_scales))
        if self.kind == "dense" and (self.dequantized or len(self.bases) == 1):
            return tuple(b.weight.data_ptr() for b in self.bases)
        return ()

    @torch.no_grad()
    def refresh(self) -> bool:
        """Copy the adapters' current weights (and the biases / concatenated BF16 weights) in; rebuild if the
        model's tensors were replaced. Returns True if it rebuilt (captured graphs then read stale addresses)."""
        if self.kind == "call":
            return False
        rebuilt = False
        if self.kind == "fp4" and self.in_place:
            now = tuple(t.data_ptr() for b in self.bases for p in (b.kernel_weight(),)
                        for t in (p.words, p.scales, p.out_scales))
            rebuilt = now != self._ptrs
        elif self.kind == "dense" and (self.dequantized or len(self.bases) == 1):
            rebuilt = self._watched() != self._ptrs
        if rebuilt:
            self._build()
            return True
        row = 0
        for i, (b, n) in enumerate(zip(self.bases, self.sizes)):
            if self.bias is not None:
                if b.bias is not None:
                    self.bias[row:row + n].copy_(b.bias)
            if self.kind == "dense" and self.w is not None and len(self.bases) > 1 and not self.dequantized:
                self.w[row:row + n].copy_(b.weight)
            f = self.factors[i]
            if f is not None and self.a_cat is not None:
                a, bw, s = f
                r = a.shape[0]
                self.a_cat[i * self.r:i * self.r + r].copy_(a)
                self.lora_b[row:row + n, :r].copy_(bw * s)
            row += n
        return False

    # ---- the products -----------------------------------------------------------------------------------------
    def lora_t(self, x: torch.Tensor) -> torch.Tensor | None:
        """x A_cat^T [..., R * members] (None without adapters or for kind "call"): at most `split_rows` rows (the
        engine's Triton kernels: qerl_kernels.decode.lora_split_max_rows) one launch of qerl_kernels.decode.lora_down,
        else cuBLAS (whose skinny GEMM is a split-K pass and a reduction)."""
        if self.a_cat is None or self.kind == "call":
            return None
        if self.splits_lora(x):
            return lora_down(x, self.a_cat, use_triton=True)
        return F.linear(x, self.a_cat)

    def splits_lora(self, x: torch.Tensor) -> bool:
        """Whether this group's LoRA down-products of input x are the split kernel's (qerl_kernels.decode.lora_down,
        or fused into the kernel producing x): adapters and at most `split_rows` rows."""
        return self.a_cat is not None and self.kind != "call" and x.numel() // x.shape[-1] <= self.split_rows

    def project(self, x: torch.Tensor, t: torch.Tensor | None = None):
        """(member outputs without their LoRA update, t, bias still to add or None); `t`: x A_cat^T if the caller
        computed it already (the engine's fused norm), else computed here."""
        if self.kind == "call":
            return [m(x) for m in self.mods], None, None
        t = self.lora_t(x) if t is None else t
        if self.kind == "fp4":
            y = fp4_linear_fused(x, self.w)  # Triton for CUDA fp16/bf16, else the reference
            return [y[..., r:r + n] for r, n in self.parts], t, self.bias
        if self.kind == "dense":
            if self.w is not None:
                y = F.linear(x, self.w, self.bias)
                return [y[..., r:r + n] for r, n in self.parts], t, None
            return [F.linear(x, b.weight, b.bias) for b in self.bases], t, None
        return [b(x) for b in self.bases], t, None

    def residual(self, x: torch.Tensor, h: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        """h + module(x) (a single member: o_proj or down_proj), LoRA included; `t`: x A_cat^T if the caller computed
        it already (the engine's fused activation), else computed here. `h` may be overwritten with the result
        (the engine never reads the residual stream it hands in again): a dense base then adds into it in place,
        without the copy of h an out-of-place addmm launches (one kernel fewer per layer and group)."""
        if self.kind == "call":
            return h + self.mods[0](x)
        t = self.lora_t(x) if t is None else t
        lora = None if t is None else (t, self.lora_b)
        if self.kind == "fp4":
            return fp4_linear_fused(x, self.w, self.bias, lora=lora, residual=h)
        if self.kind == "dense":
            lead = h.shape[:-1]
            h2, x2 = h.reshape(-1, h.shape[-1]), x.reshape(-1, x.shape[-1])
            out = h2.addmm_(x2, self.w.t()) if self.bias is None else torch.addmm(h2 + self.bias, x2, self.w.t())
        else:
            lead = h.shape[:-1]
            out = (h + self.bases[0](x)).reshape(-1, h.shape[-1])
        if t is not None:
            out = out.addmm_(t.reshape(out.shape[0], -1), self.lora_b.t())
        return out.view(*lead, -1)
