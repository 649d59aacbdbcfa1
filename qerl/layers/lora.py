"""peft LoRA over QuantLinear: register the layer with peft so `get_peft_model` wraps it as it wraps nn.Linear.

Why this is needed: peft dispatches on the base layer's type, and QuantLinear is deliberately not an nn.Linear
subclass (it has no weight Parameter). peft's documented hook for such layers is
`LoraConfig._register_custom_module({LayerType: LoraLayerType})` ("custom models" developer guide); the LoRA layer we
register is peft's own `lora.Linear` (it only needs `in_features`/`out_features` and calls the base layer's forward),
with merging refused: folding a LoRA delta into a 4-bit weight would need a requantization, and QeRL keeps the adapter
separate anyway (rollout and training run the same unmerged model).

Usage:
    config = lora_config(r=16, lora_alpha=32, target_modules=["q_proj", ..., "down_proj"])   # a peft LoraConfig
    model = peft.get_peft_model(quantized_model, config)
or `register_quant_linear(existing_lora_config)`.

`adapter_factors(layer)` is what a reader of the model that computes the LoRA update itself (the decode engine's
projection groups, qerl/rl/engine_groups.py) asks a LoRA layer for, so it never reaches into peft's attributes.
"""
from __future__ import annotations

from peft import LoraConfig
from torch import nn
from peft.tuners.lora.layer import Linear as _PeftLoraLinear

from qerl.layers.quant_linear import QuantLinear

__all__ = ["QuantLoraLinear", "register_quant_linear", "lora_config", "adapter_factors"]


def adapter_factors(module):
    """The frozen base layer and the active LoRA factors of `module`, for code that applies the update itself.

    Works for any peft LoRA layer (lora.Linear over nn.Linear, QuantLoraLinear, bitsandbytes' Linear4bit) and for
    plain layers. The returned tensors are the layer's own parameters (read them, do not write them).

    Args:
        module: a linear layer, LoRA-wrapped or not.

    Returns:
        (base, factors): `base` the layer whose forward gives x W^T + b; `factors` a list of (A [r, in],
        B [out, r], scale) for the active adapters (y = base(x) + sum scale * x A^T B^T), [] for a plain layer or
        disabled adapters, or None when the layer must be called as a whole (merged weights, DoRA, or dropout
        active in training mode): then `base` is the module itself.
    """
    if not (hasattr(module, "base_layer") and hasattr(module, "lora_A")):
        return module, []
    if getattr(module, "merged", False):
        return module, None
    if getattr(module, "disable_adapters", False):
        return module.get_base_layer(), []
    factors = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if module.use_dora.get(name, False):
            return module, None
        drop = module.lora_dropout[name]
        if module.training and isinstance(drop, nn.Dropout) and drop.p > 0:
            return module, None
        factors.append((module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name])))
    return module.get_base_layer(), factors


class QuantLoraLinear(_PeftLoraLinear):
    """peft's LoRA Linear around a QuantLinear base; merge/unmerge raise (the base weight is 4-bit)."""

    def adapter_factors(self):
        """`adapter_factors(self)`: (the QuantLinear base, [(A, B, scale), ...]) of the active adapters."""
        return adapter_factors(self)

    def _get_in_out_features(self, module):
        # peft's generic lookup would work too, but warns "Unsupported layer type" for any non-peft class.
        if isinstance(module, QuantLinear):
            return module.in_features, module.out_features
        return super()._get_in_out_features(module)

    def merge(self, safe_merge: bool = False, adapter_names=None) -> None:
        raise RuntimeError(
            f"cannot merge LoRA into a 4-bit QuantLinear ({self.get_base_layer().extra_repr()}): the base is frozen "
            "and packed; keep the adapter separate, or dequantize the model first"
        )

    def unmerge(self) -> None:
        raise RuntimeError("QuantLoraLinear never merges, so there is nothing to unmerge")


def register_quant_linear(config: LoraConfig) -> LoraConfig:
    """Teach `config` to wrap QuantLinear layers with QuantLoraLinear; returns the same config.

    Args:
        config: a peft LoraConfig.

    Returns:
        `config`, with the custom module mapping registered.
    """
    config._register_custom_module({QuantLinear: QuantLoraLinear})
    return config


def lora_config(**kwargs) -> LoraConfig:
    """`peft.LoraConfig(**kwargs)` with QuantLinear registered (see register_quant_linear)."""
    return register_quant_linear(LoraConfig(**kwargs))
