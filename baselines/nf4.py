"""NF4 (bitsandbytes) for the QLoRA baseline, with QLoRA's defaults: NF4 codes, blocksize 64, double quantization
of the absmax constants, compute in the model dtype (bfloat16 in the paper).

Why bitsandbytes itself: the paper's "NF4 LoRA (QLoRA)" rows are the QLoRA recipe as people run it, i.e.
bitsandbytes' Linear4bit (which peft's LoRA wraps natively). Two ways in, same layer:
    quantize_nf4_(model)                                # convert a loaded model (qerl.layers.quantize_ + peft flag)
    AutoModelForCausalLM.from_pretrained(dir, quantization_config=bnb_config())   # transformers' loader

CPU: on CPUs with AVX512-BF16, bitsandbytes repacks a layer's weight into a bf16 inference layout on its first
eval-mode no-grad forward, after which training through that layer fails; QeRL's loop runs rollouts (no grad) and
training on the same model, so every layer made here keeps the trainable layout (`keep_trainable_layout`).

CPU: bitsandbytes >= 0.48 ships a CPU backend (quantize, dequantize, 4-bit matmul, backward); it is checked on use and
a clear RuntimeError names the problem if the installed build cannot quantize on this device. Deviation: none in the
format; note that the absmax constants live in bitsandbytes' QuantState objects, not in module buffers, so
qerl.layers.model_nbytes sees only the 4-bit codes of an NF4 model (nf4_nbytes adds them back).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["NF4Config", "quantize_nf4_", "bnb_config", "nf4_linear", "nf4_nbytes", "keep_trainable_layout",
           "bitsandbytes_cpu_problem", "DECODE_DEQUANTIZED", "mark_decode_dequantized", "dequantized_weight"]

#: attribute of a bitsandbytes Linear4bit that lets the decode engine (qerl.rl.engine_groups) run it from a 16-bit
#: copy of its dequantized weight (set by `mark_decode_dequantized`)
DECODE_DEQUANTIZED = "qerl_decode_dequantized"

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def bitsandbytes_cpu_problem() -> str | None:
    """None if bitsandbytes can quantize and run an NF4 layer on CPU here, else the reason (for skips and errors)."""
    try:
        import bitsandbytes as bnb
    except Exception as exc:  # ImportError, or a broken native library
        return f"bitsandbytes cannot be imported: {exc}"
    try:
        layer = _make(bnb, nn.Linear(64, 8), torch.float32, 64, True, "cpu")
        layer(torch.zeros(1, 64))
    except Exception as exc:
        return f"bitsandbytes {bnb.__version__} cannot run NF4 on CPU: {type(exc).__name__}: {exc}"
    return None


def _make(bnb, linear: nn.Linear, compute_dtype, blocksize: int, double_quant: bool, device):
    layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              compute_dtype=compute_dtype, compress_statistics=double_quant, quant_type="nf4",
                              device="meta")
    layer.weight = bnb.nn.Params4bit(linear.weight.detach().clone(), requires_grad=False,
                                     quant_type="nf4", blocksize=blocksize, compress_statistics=double_quant)
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().to(compute_dtype).clone(), requires_grad=False)
    layer.support_avx512bf16_for_cpu = False  # see the module docstring
    return layer.to(device)  # Params4bit quantizes on its first move to a device (where the weight already is)


def keep_trainable_layout(model: nn.Module) -> nn.Module:
    """Stop bitsandbytes from repacking CPU weights for inference (see the module docstring); returns the model."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return model


def mark_decode_dequantized(model: nn.Module) -> int:
    """Let the decode engine (rollouts and evaluations, qerl.rl.engine) run the NF4 layers of `model` from a copy of
    their dequantized weights in the compute dtype (config `model.nf4_decode: dequantized`); returns how many layers
    it marked. Training (the model's own forward and backward) still goes through bitsandbytes.

    Why: for more than one row bitsandbytes' Linear4bit dequantizes its weight and multiplies in the compute dtype at
    every call, so a decode step pays a dequantization and a GEMM per layer (QLoRA's rollouts took 10.6-13.0 s a step
    on the small scale's H100 run 12, BF16 LoRA's 5.2-5.4). The copy gives the same products once per engine, the
    q/k/v and gate/up members in one GEMM each. Cost: the copy (the 4-bit layers in 16 bits: 0.2 GB for
    SmolLM2-135M, ~13 GB for a 7B), which is why bitsandbytes stays the default (a single-row bitsandbytes product
    is its own 4-bit kernel, which this replaces too).
    """
    import bitsandbytes as bnb

    n = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            setattr(module, DECODE_DEQUANTIZED, True)
            n += 1
    return n


def dequantized_weight(layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The [out, in] weight of a bitsandbytes NF4 layer, dequantized as its forward does, in `dtype`."""
    import bitsandbytes.functional as bnbf

    w = layer.weight
    return bnbf.dequantize_4bit(w.data, w.quant_state).to(dtype).reshape(layer.out_features, layer.in_features)


def nf4_linear(linear: nn.Linear, compute_dtype: torch.dtype | None = None, blocksize: int = 64,
               double_quant: bool = True) -> nn.Module:
    """bitsandbytes Linear4bit (NF4) holding `linear`'s weight, on `linear`'s device.

    Args:
        linear: the layer to quantize.
        compute_dtype: dtype of the matmul (default: the layer's dtype).
        blocksize: NF4 block size (QLoRA: 64).
        double_quant: quantize the absmax constants too (QLoRA: True).

    Returns:
        bitsandbytes.nn.Linear4bit.

    Raises:
        RuntimeError: bitsandbytes is missing or cannot quantize on this device (the message says why).
    """
    try:
        import bitsandbytes as bnb
    except Exception as exc:
        raise RuntimeError(f"NF4 needs bitsandbytes, which cannot be imported here: {exc}") from exc
    device = linear.weight.device
    try:
        return _make(bnb, linear, compute_dtype or linear.weight.dtype, blocksize, double_quant, device)
    except Exception as exc:
        raise RuntimeError(f"bitsandbytes {bnb.__version__} cannot quantize NF4 on {device} for a layer of weight "
                           f"shape {tuple(linear.weight.shape)}: {type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True)
class NF4Config:
    """quantize_ config: NF4 with QLoRA's defaults (see module docstring).

    Attributes:
        targets: last name components of the layers to convert.
        compute_dtype: matmul dtype (None: each layer's own dtype).
        blocksize: NF4 block size.
        double_quant: double quantization of the absmax constants.
    """

    targets: tuple[str, ...] = DEFAULT_TARGETS
    compute_dtype: torch.dtype | None = None
    blocksize: int = 64
    double_quant: bool = True
    fmt = "nf4"  # class constant, not a field

    def convert(self, linear: nn.Linear) -> nn.Module:
        """The bitsandbytes Linear4bit replacing `linear`."""
        return nf4_linear(linear, self.compute_dtype, self.blocksize, self.double_quant)


def quantize_nf4_(model: nn.Module, config: NF4Config | None = None, filter_fn=None) -> nn.Module:
    """quantize_(model, NF4Config()) plus the flag transformers sets when it loads a 4-bit model, so that peft wraps
    the layers with its bitsandbytes-aware LoRA layer (as for a model loaded with bnb_config()).

    Raises:
        RuntimeError: bitsandbytes cannot quantize here.
    """
    from qerl.layers import quantize_

    quantize_(model, config or NF4Config(), filter_fn)
    model.is_loaded_in_4bit = True
    return model


def bnb_config(compute_dtype: torch.dtype = torch.bfloat16, targets: tuple[str, ...] = DEFAULT_TARGETS):
    """transformers BitsAndBytesConfig for QLoRA: NF4, double quant, `compute_dtype`; only `targets` quantized.

    Everything that is not a target (lm_head in particular) is listed in llm_int8_skip_modules by the caller's
    model; here lm_head is skipped explicitly, as QLoRA does.
    """
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype, llm_int8_skip_modules=["lm_head"])


def nf4_nbytes(model: nn.Module) -> int:
    """Bytes of a model with bitsandbytes NF4 layers: parameters and buffers plus each layer's absmax constants."""
    from qerl.layers import model_nbytes

    total = model_nbytes(model)
    for m in model.modules():
        state = getattr(getattr(m, "weight", None), "quant_state", None)
        if state is None:
            continue
        total += state.absmax.numel() * state.absmax.element_size()
        if getattr(state, "state2", None) is not None:
            total += state.state2.absmax.numel() * state.state2.absmax.element_size() + 4  # + the FP32 offset
    # (the 16- and 256-entry code tables are constants of the format and are not counted)
    return total
