"""QuantLinear: a frozen 4-bit (NVFP4 or MXFP4) linear layer, and `quantize_`, the torchao-shaped conversion API.

Why: QeRL trains LoRA adapters on top of a frozen NVFP4 base and uses the same model for rollouts and logits. A plain
nn.Module holding the packed tensors as buffers keeps that simple: peft's LoRA wraps it (see qerl.layers.lora),
gradient checkpointing and torch.compile see an ordinary module, and state_dict() holds exactly the packed bytes.

Storage (buffers, all persistent):
    codes              uint8 [out, in // 2]          two E2M1 codes per byte, element 2j in the low nibble
    scale_bits         uint8 [out, in // block]      NVFP4: the bytes of float8_e4m3fn; MXFP4: E8M0 exponents
    global_scale_bits  int32 0-dim (NVFP4 only)      the bits of the float32 global scale
The `scales` and `global_scale` properties return the contract dtypes (float8_e4m3fn / uint8, float32) as views.
Scales and the global scale are stored as integer bits because nn.Module.to(dtype) / .half() cast every floating
buffer: float8 scales and the float32 global scale would otherwise be silently rewritten by model.to(bfloat16).

Prepared form (the CUDA kernels' layout, qerl_kernels/layout.py): the first CUDA forward with fp16/bf16 activations
(or an explicit `prepare_kernels()`) converts the weight to the kernels' layout and, when `codes` / `scale_bits` can be
re-derived from it bit for bit (always, for what the quantizers produce), drops them: the layer then holds 4.5 bits
per weight (NVFP4; 4.25 MXFP4) plus 8 bytes per row, not the 9 of both copies. Non-persistent buffers:
    w4_words           int32 [out_pad, in_pad // 8]        the re-laid-out codes
    w4_scales          int16 / uint8 [out_pad, in_pad // 32] the scales as the kernels read them
    w4_out_scales_bits int32 [2, out_pad]                  per-row fp32 factors, as bits (dtype casts leave them)
`codes` and `scale_bits` stay readable (re-derived on access), state_dict() writes them as before, and
load_state_dict() re-prepares; `unprepare_kernels()` restores the storage layout.

Usage:
    quantize_(model, NVFP4Config())                      # q/k/v/o/gate/up/down -> QuantLinear; the rest untouched
    quantize_(model, MXFP4Config(), filter_fn=lambda m, fqn: "mlp" in fqn and isinstance(m, nn.Linear))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from qerl.formats import BITS_PER_WEIGHT, FORMATS, MXFP4Tensor, NVFP4Tensor
from qerl.layers.ops import dequantize_weight, w4a16_linear, w4a16_linear_prepared

__all__ = [
    "DEFAULT_TARGETS",
    "QuantLinear",
    "share_kernel_storage",
    "NVFP4Config",
    "MXFP4Config",
    "quantize_",
    "default_filter",
    "model_nbytes",
    "expected_nbytes",
]

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: QuantLinear.dense_weight keeps the dequantized weight of layers up to this size (2**21 weights, 8 MB in float32,
#: 4 MB in bfloat16): every layer of the tiny model and of SmolLM2-135M (at most 1536 x 576; ~0.4 GB dense in all on a
#: CPU, ~0.2 GB in bfloat16 on a GPU), none of a Qwen2.5-0.5B or larger, which keep only their 4-bit bytes
DENSE_CACHE_ELEMENTS = 2**21


class QuantLinear(nn.Module):
    """A frozen linear layer whose weight is stored packed in NVFP4 or MXFP4 (y = x W^T + b).

    Args:
        in_features: K (divisible by the format's block size: 16 for nvfp4, 32 for mxfp4).
        out_features: N.
        bias: whether the layer has a (frozen) bias.
        fmt: "nvfp4" or "mxfp4".
        dtype: compute dtype: what `weight` returns and what the bias is stored in.
        device: where the buffers live.

    Raises:
        ValueError: unknown format or in_features not divisible by the block size.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, fmt: str = "nvfp4",
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"unknown 4-bit format {fmt!r}; known: {sorted(FORMATS)}")
        block = FORMATS[fmt].BLOCK_SIZE
        if in_features % block:
            raise ValueError(f"QuantLinear: in_features={in_features} (weight shape ({out_features}, {in_features})) "
                             f"is not divisible by the {fmt} block size {block}")
        self.in_features, self.out_features, self.fmt = in_features, out_features, fmt
        self.compute_dtype = dtype
        self.register_buffer("codes", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("scale_bits", torch.zeros(out_features, in_features // block, dtype=torch.uint8,
                                                       device=device))
        if fmt == "nvfp4":
            self.register_buffer("global_scale_bits", torch.ones((), device=device).view(torch.int32).clone())
        else:
            self.register_buffer("global_scale_bits", None)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False) \
            if bias else None

    # ---- contract views -------------------------------------------------------------------------------------
    @property
    def scales(self) -> torch.Tensor:
        """float8_e4m3fn [out, in // 16] (nvfp4) or uint8 E8M0 [out, in // 32] (mxfp4); a view of scale_bits."""
        return self.scale_bits.view(torch.float8_e4m3fn) if self.fmt == "nvfp4" else self.scale_bits

    @property
    def global_scale(self) -> torch.Tensor | None:
        """float32 0-dim dequantization multiplier (nvfp4), None for mxfp4; a view of global_scale_bits."""
        return None if self.global_scale_bits is None else self.global_scale_bits.view(torch.float32)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized weight [out, in] in compute_dtype, for inspection only: the kept copy of dense_weight where
        there is one (peft reads `weight` of every layer it wraps: re-dequantizing SmolLM2-135M's layers on each read
        was a quarter of a 2-step CPU training job), else materialized on each access."""
        kept = self.dense_weight(self.compute_dtype)
        if kept is not None:
            return kept
        with torch.no_grad():
            return dequantize_weight(self.codes, self.scales, self.global_scale, self.fmt, self.compute_dtype)

    def packed(self) -> NVFP4Tensor | MXFP4Tensor:
        """The weight as a qerl.formats packed tensor (sharing storage with the buffers; once the layer is
        prepared and the storage layout dropped, a re-derived copy)."""
        shape = torch.Size((self.out_features, self.in_features))
        if self.fmt == "nvfp4":
            return NVFP4Tensor(self.codes, self.scales, self.global_scale, shape, self.compute_dtype)
        return MXFP4Tensor(self.codes, self.scales, shape, self.compute_dtype)

    # ---- construction -----------------------------------------------------------------------------------------
    @classmethod
    def from_packed(cls, packed: NVFP4Tensor | MXFP4Tensor, bias: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None) -> "QuantLinear":
        """A QuantLinear holding `packed` (a 2-D NVFP4Tensor / MXFP4Tensor) and an optional bias.

        Raises:
            ValueError: packed is not 2-D or not one of the two formats.
        """
        if isinstance(packed, NVFP4Tensor):
            fmt = "nvfp4"
        elif isinstance(packed, MXFP4Tensor):
            fmt = "mxfp4"
        else:
            raise ValueError("QuantLinear.from_packed: expected NVFP4Tensor or MXFP4Tensor, "
                             f"got {type(packed).__name__}")
        if len(packed.shape) != 2:
            raise ValueError(f"QuantLinear.from_packed: expected a 2-D weight, got shape {tuple(packed.shape)}")
        out_features, in_features = packed.shape
        dtype = dtype or packed.dtype
        layer = cls(in_features, out_features, bias is not None, fmt, dtype, device=packed.codes.device)
        layer.codes.copy_(packed.codes)
        layer.scale_bits.copy_(packed.scales.view(torch.uint8))
        if fmt == "nvfp4":
            layer.global_scale_bits.copy_(packed.global_scale.float().reshape(()).view(torch.int32))
        if bias is not None:
            layer.bias.data.copy_(bias.detach().to(dtype))
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str) -> "QuantLinear":
        """Round-to-nearest quantization of an nn.Linear's weight (AWQ scaling, if any, is applied beforehand).

        Raises:
            ValueError: unknown format, in_features not divisible by the block size, or non-finite weights.
        """
        if fmt not in FORMATS:
            raise ValueError(f"unknown 4-bit format {fmt!r}; known: {sorted(FORMATS)}")
        w = linear.weight.detach()
        block = FORMATS[fmt].BLOCK_SIZE
        if w.shape[-1] % block:
            raise ValueError(f"QuantLinear.from_linear: weight shape {tuple(w.shape)}: in_features is not divisible "
                             f"by the {fmt} block size {block}")
        return cls.from_packed(FORMATS[fmt].quantize(w), linear.bias, dtype=w.dtype)

    # ---- nn.Module ------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
            if not self.is_prepared:
                self.prepare_kernels()
            kept = self.dense_weight(x.dtype, rows=x.numel() // max(x.shape[-1], 1))
            if kept is not None:  # what the kernels' dispatch computes at these rows, minus its dequantize launch
                return F.linear(x, kept, self.bias)
            return w4a16_linear_prepared(x, self.prepared(), self.bias)
        dense = self.dense_weight(x.dtype)
        if dense is not None and not torch.is_grad_enabled():  # rollouts, log-prob and evaluation passes
            return F.linear(x, dense, self.bias)  # w4a16_linear's product with `dense`, without its autograd.Function
        return w4a16_linear(x, self.codes, self.scales, self.global_scale, self.bias, fmt=self.fmt, dense=dense)

    def dense_weight(self, dtype: torch.dtype, rows: int | None = None) -> torch.Tensor | None:
        """The dequantized weight in `dtype`, kept between calls while the packed buffers are unchanged, for a layer
        of at most DENSE_CACHE_ELEMENTS weights: on the CPU (storage layout) always, on CUDA (prepared layout) for
        calls of more than `dequantize_only_above()` rows (below); None otherwise (the torch path then dequantizes on
        every call, the Triton kernels read the packed weight).

        Why: a CPU forward dequantizes the whole weight (about ten small ops) before its matmul, and the backward
        again. For the tiny scale's 64-wide layers that cost more than the matmul itself in a decode step: 18 % of
        an NVFP4 rollout on a 2-core Xeon (SmolLM2-135M's 2-step CPU smoke run: rollout 4.0 -> 2.1 s). The kept copy
        is what each call would compute (the same function of the same buffers), so every number stays the same;
        the size cap keeps the 4-bit memory saving of larger models. The copy is keyed on the buffers' identity and
        in-place version, so load_state_dict, .to() or a prepare_kernels() replace it, and it is never saved (not a
        buffer).

        On CUDA (a prepared layer, fp16/bf16) the same cap holds, and a copy is returned only for a call of `rows`
        rows above qerl_kernels' `dequantize_only_above()` (training passes, log-prob passes, prefills): there the
        kernels' dispatch has one path, dequantize (`fp4_dequantize`) + cuBLAS, and the kept copy is that kernel's
        output, so the forward is the same product without a dequantize launch and without the custom op around it.
        Why: SmolLM2-135M's update passes are launch-bound (H100: 42k kernels, GPU busy 28 %; QeRL's update 3.1-4.1 s
        against BF16 LoRA's 1.4-2.1 s at the same shapes). Decode steps (small M) keep the fused 4-bit kernels.
        """
        if self.in_features * self.out_features > DENSE_CACHE_ELEMENTS or torch.compiler.is_compiling():
            return None
        cuda = self.is_prepared and self.w4_words.is_cuda
        if cuda:
            from qerl_kernels.fp4_launch import dequantize_only_above
            if (rows is None or rows <= dequantize_only_above() or dtype not in (torch.float16, torch.bfloat16)
                    or torch.cuda.is_current_stream_capturing()):
                return None
            buffers = (self.w4_words, self.w4_scales, self.w4_out_scales_bits)
        elif self.is_prepared or self.codes.is_cuda:
            return None
        else:
            buffers = tuple(t for t in (self.codes, self.scale_bits, self.global_scale_bits) if t is not None)
        # the buffers themselves (kept alive, so no address is reused) and their in-place versions
        stamp = [(t, t._version) for t in buffers]
        kept = self.__dict__.get("_dense")  # (dtype, stamp, weight)
        if kept is None or kept[0] != dtype or len(kept[1]) != len(stamp) or any(
                a is not b or u != v for (a, u), (b, v) in zip(kept[1], stamp)):
            with torch.no_grad():
                if cuda:
                    from qerl_kernels.fp4_launch import fp4_dequantize
                    weight = fp4_dequantize(self.prepared(), dtype)
                else:
                    weight = dequantize_weight(self.codes, self.scales, self.global_scale, self.fmt, dtype)
            kept = (dtype, stamp, weight)
            self.__dict__["_dense"] = kept
        return kept[2]

    # ---- prepared form (the CUDA kernels' layout) -------------------------------------------------------------
    @property
    def is_prepared(self) -> bool:
        """True once the weight is held in the kernels' layout (see the module docstring)."""
        return "w4_words" in self._buffers

    def prepared(self):
        """The weight as qerl_kernels.PreparedFP4 (views of this layer's buffers; for concat_prepared etc.).

        Raises:
            RuntimeError: the layer is not prepared (call prepare_kernels() first).
        """
        if not self.is_prepared:
            raise RuntimeError("QuantLinear.prepared: call prepare_kernels() first")
        from qerl_kernels import PreparedFP4
        return PreparedFP4(self.w4_words, self.w4_scales, self.w4_out_scales_bits.view(torch.float32),
                           self.out_features, self.in_features, 0 if self.fmt == "nvfp4" else 1)

    def kernel_weight(self, in_place: bool = True):
        """The weight in the kernels' layout (qerl_kernels.PreparedFP4), for code that launches the kernels itself
        (the decode engine; its q/k/v and gate/up groups come from `share_kernel_storage`).

        Args:
            in_place: convert this layer first if needed (what its first CUDA forward does) and return views of its
                buffers; False: a separate prepared copy, the layer left as it is (CPU readers).

        Returns:
            qerl_kernels.PreparedFP4 on the layer's device.
        """
        if self.is_prepared:
            return self.prepared()
        if in_place:
            self.prepare_kernels()
            return self.prepared()
        import qerl_kernels
        return qerl_kernels.prepare(self.codes, self.scales, self.global_scale, self.fmt)

    def _derive_storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, scale_bits) re-derived from the prepared form."""
        from qerl_kernels import mxfp4 as kmx
        from qerl_kernels import nvfp4 as knv
        p = self.prepared()
        if self.fmt == "nvfp4":
            codes, scales, _ = knv.unprepare(p)
            return codes, scales.view(torch.uint8)
        return kmx.unprepare(p)

    def prepare_kernels(self) -> bool:
        """Convert the weight to the kernels' layout on its current device and keep only that when possible.

        Returns:
            True if `codes` / `scale_bits` were dropped (re-derivable bit for bit), False if they are kept beside the
            prepared form (some zero-scale block held non-zero codes, or a scale that decodes to zero was not +0).
        """
        if self.is_prepared:
            return "codes" not in self._buffers
        import qerl_kernels
        with torch.no_grad():
            p = qerl_kernels.prepare(self.codes, self.scales, self.global_scale, self.fmt)
            self.register_buffer("w4_words", p.words, persistent=False)
            self.register_buffer("w4_scales", p.scales, persistent=False)
            self.register_buffer("w4_out_scales_bits", p.out_scales.view(torch.int32), persistent=False)
            codes, scale_bits = self._derive_storage()
            exact = torch.equal(codes, self._buffers["codes"]) and torch.equal(scale_bits, self._buffers["scale_bits"])
        if exact:
            del self._buffers["codes"], self._buffers["scale_bits"]
        return exact

    def unprepare_kernels(self) -> None:
        """Back to the storage layout only (codes / scale_bits buffers, no prepared form)."""
        if not self.is_prepared:
            return
        if "codes" not in self._buffers:
            codes, scale_bits = self._derive_storage()
            self._buffers["codes"], self._buffers["scale_bits"] = codes, scale_bits
        for name in ("w4_words", "w4_scales", "w4_out_scales_bits"):
            del self._buffers[name]

    def __getattr__(self, name: str):
        if name in ("codes", "scale_bits"):
            buffers = self.__dict__.get("_buffers", {})
            if name not in buffers and "w4_words" in buffers:
                return self._derive_storage()[0 if name == "codes" else 1]
        return super().__getattr__(name)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.is_prepared and "codes" not in self._buffers:  # same keys and bytes as an unprepared layer
            codes, scale_bits = self._derive_storage()
            destination[prefix + "codes"], destination[prefix + "scale_bits"] = codes, scale_bits

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        was_prepared = self.is_prepared
        self.unprepare_kernels()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if was_prepared:
            self.prepare_kernels()

    def _apply(self, fn, recurse=True):
        # Follow dtype casts (model.to(bfloat16)) in compute_dtype; the packed buffers are integers and keep theirs.
        super()._apply(fn, recurse)
        device = self._buffers["w4_words" if self.is_prepared else "codes"].device
        self.compute_dtype = fn(torch.empty(0, dtype=self.compute_dtype, device=device)).dtype
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fmt={self.fmt}, compute_dtype={self.compute_dtype}")


def share_kernel_storage(layers):
    """One prepared group over QuantLinear layers of one K and format (q/k/v, gate/up) whose rows ARE the layers'
    kernel buffers: each layer's `w4_words` / `w4_scales` become row views of one allocation per tensor kind.

    Why: the decode engine runs such layers as one launch, and every kernel takes a group as one contiguous operand.
    A `concat_prepared` copy would hold their 4.5 bits per weight a second time (~2.9 GB for Qwen2.5-7B); a group
    whose members sit in one allocation costs no extra memory. The values do not change (the layers' forward,
    state_dict and `dense_weight` give the same), the buffers stay non-persistent, and a call on layers that
    already share their storage returns the group again without copying (`qerl_kernels.layout.stacked_view`).
    Moving a layer (`.to(device)`) gives it its own buffers again.

    Args:
        layers: QuantLinear layers of equal in_features and format, on one device (prepared here if needed).

    Returns:
        qerl_kernels.PreparedFP4 with `parts` (one per layer, in order), viewing the layers' buffers.

    Raises:
        ValueError: layers of different K, format or device.
    """
    import qerl_kernels
    from qerl_kernels.layout import stacked_view

    layers = list(layers)
    for layer in layers:
        layer.prepare_kernels()
    members = [layer.prepared() for layer in layers]
    group = stacked_view(members)
    if group is not None:
        return group
    group = qerl_kernels.concat_prepared(members)
    for layer, p, (row, _) in zip(layers, members, group.parts):
        rows = p.words.shape[0]
        layer._buffers["w4_words"] = group.words[row:row + rows]
        layer._buffers["w4_scales"] = group.scales[row:row + rows]
    return group


# ---- torchao-shaped conversion API ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _FP4Config:
    """Convert matching nn.Linear layers to a 4-bit QuantLinear of the subclass's `fmt` (round-to-nearest on the
    current weights).

    Attributes:
        targets: last name components of the layers to convert (used by the default filter).
    """

    targets: tuple[str, ...] = DEFAULT_TARGETS
    fmt = ""  # class constant of each subclass, not a field

    def convert(self, linear: nn.Linear) -> nn.Module:
        """The replacement module for `linear`."""
        return QuantLinear.from_linear(linear, self.fmt)


@dataclass(frozen=True)
class NVFP4Config(_FP4Config):
    """quantize_ config for NVFP4 (E2M1, E4M3 scale per 16, FP32 global scale)."""

    fmt = "nvfp4"


@dataclass(frozen=True)
class MXFP4Config(_FP4Config):
    """quantize_ config for MXFP4 (E2M1, E8M0 scale per 32)."""

    fmt = "mxfp4"


def default_filter(config) -> Callable[[nn.Module, str], bool]:
    """The filter quantize_ uses when none is given: an nn.Linear whose name ends in one of config.targets."""
    targets = set(config.targets)

    def filter_fn(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and fqn.rsplit(".", 1)[-1] in targets

    return filter_fn


def quantize_(model: nn.Module, config, filter_fn: Callable[[nn.Module, str], bool] | None = None) -> nn.Module:
    """Replace, in place, every module for which filter_fn(module, fqn) holds by config.convert(module).

    Embeddings, lm_head and norms stay as they are under the default filter (only q/k/v/o/gate/up/down match).

    Args:
        model: the model to convert (modified in place).
        config: NVFP4Config, MXFP4Config, or any object with `convert(module) -> module` and `targets`
            (baselines.nf4.NF4Config).
        filter_fn: (module, fully-qualified name) -> bool; default: `default_filter(config)`.

    Returns:
        The same model.

    Raises:
        ValueError: a matched layer cannot be converted (the message names the layer and its shape).
    """
    filter_fn = filter_fn or default_filter(config)
    matches = [(fqn, m) for fqn, m in model.named_modules() if fqn and filter_fn(m, fqn)]
    for fqn, module in matches:
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        try:
            new = config.convert(module)
        except ValueError as exc:
            raise ValueError(f"quantize_: cannot convert {fqn!r}: {exc}") from exc
        new.train(module.training)  # a fresh module starts in training mode; keep the model's mode
        setattr(parent, child, new)
    return model


# ---- memory accounting ------------------------------------------------------------------------------------------
def model_nbytes(model: nn.Module) -> int:
    """Bytes held by a model's parameters and buffers, each storage counted once (tied weights count once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.device, t.untyped_storage().data_ptr())
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def expected_nbytes(model: nn.Module, fmt: str, filter_fn: Callable[[nn.Module, str], bool] | None = None,
                    targets: tuple[str, ...] = DEFAULT_TARGETS) -> int:
    """Bytes a model WOULD take after quantize_ with `fmt`, from the format's bits per weight alone.

    Computed on the unquantized model: matched linear weights cost BITS_PER_WEIGHT[fmt] / 8 bytes per element
    (+ 4 bytes of global scale for nvfp4); every other parameter and buffer (embeddings, lm_head, norms, biases)
    keeps its size; tied storages count once.

    Raises:
        ValueError: unknown format.
    """
    if fmt not in BITS_PER_WEIGHT:
        raise ValueError(f"unknown 4-bit format {fmt!r}; known: {sorted(BITS_PER_WEIGHT)}")
    filter_fn = filter_fn or default_filter(NVFP4Config(targets=targets))
    quantized = {id(m.weight): m.weight.numel() for fqn, m in model.named_modules() if fqn and filter_fn(m, fqn)}
    seen, total = set(), 0.0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.device, t.untyped_storage().data_ptr())
        if key in seen:
            continue
        seen.add(key)
        if id(t) in quantized:
            total += quantized[id(t)] * BITS_PER_WEIGHT[fmt] / 8 + (4 if fmt == "nvfp4" else 0)
        else:
            total += t.untyped_storage().nbytes()
    return int(round(total))
