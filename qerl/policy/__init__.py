"""The policy core: every model the harness trains, evaluates, quantizes or profiles is built here.

Why: the method -> weights / format / adapters / AQN mapping used to be repeated by the trainer, the evaluator, the
quantization stage and the profilers; now `build_policy(method, base, ...)` is the only place that knows it, and
every other stage depends on this package (formats -> layers -> policy -> rl / evaluate -> CLI). It is also the only
importer of `baselines` outside the quantization stage.

Modules:
    core        build_policy, Policy, LoraSpec, AqnSpec, the checkpoint/tokenizer/adapter loaders
    formats     the weight-format dispatch (quantize_model, format_config, convert_linear), dtypes, byte counts
    checkpoint  quantized checkpoints in compressed-tensors' layout (and the NF4 recipe): save and load

Run the tests: `pytest tests/policy -q`.
"""
from qerl.policy.core import (AqnSpec, LoraSpec, Policy, build_policy, load_adapter, load_base, load_tokenizer,
                              set_gradient_checkpointing)
from qerl.policy.formats import (DTYPES, FORMATS, checkpoint_format, convert_linear, format_config, quantize_model,
                                 torch_dtype, weight_nbytes)

__all__ = [
    "AqnSpec", "LoraSpec", "Policy", "build_policy", "load_adapter", "load_base", "load_tokenizer",
    "set_gradient_checkpointing",
    "DTYPES", "FORMATS", "checkpoint_format", "convert_linear", "format_config", "quantize_model", "torch_dtype",
    "weight_nbytes",
]
