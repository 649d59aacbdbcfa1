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
"""
from __future__ import annotations

from peft import LoraConfig
from peft.tuners.lora.layer import Linear as _PeftLoraLinear

from qerl.layers.quant_linear import QuantLinear

__all__ = ["QuantLoraLinear", "register_quant_linear", "lora_config"]


class QuantLoraLinear(_PeftLoraLinear):
    """peft's LoRA Linear around a QuantLinear base; merge/unmerge raise (the base weight is 4-bit)."""

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
