"""Random-weight models of the profiled architectures, in each method's format, built layer by layer on the device.

Why layer by layer: a 72B model does not fit an H200 in BF16 (145 GB), and a 32B one would need 64 GB of BF16
before quantization. The skeleton is made on the meta device; each decoder layer is then created on the target
device with random weights (normal, std 0.02, like the published init), its q/k/v/o/gate/up/down converted to the
method's format at once (NVFP4/MXFP4: qerl.layers.QuantLinear, round-to-nearest; NF4: bitsandbytes Linear4bit),
and put in place (qerl.policy.convert_linear: the policy core's format dispatch); peak memory is the quantized model
plus one BF16 layer. Speed and memory do not depend on the weights' values (nothing is downloaded), which is what
makes this a faithful profile of the real shapes.

    model = build_random_model("7B", "qerl", rank=32, device="cuda")          # peft model, NVFP4 base
    model = build_random_model("0.5B", "lora", rank=8, layers=1, device="cpu", dtype=torch.float32)   # tests

Methods: any of qerl/contract/methods.py; `build_random_model` hands the random base to the policy core
(qerl.policy.build_policy): `full` gives the model with every weight trainable, the untrained formats
(bf16/nf4/nvfp4/mxfp4) the plain quantized model, LoRA methods a peft model (rank r, alpha 2r, all seven linears,
adapters in the dtype peft gives them, as in training). The profilers build theirs from a run's settings instead
(qerl/profiling/e2e.py).
"""
from __future__ import annotations

import torch
from torch import nn

from qerl.contract.methods import get_method
from qerl.policy.formats import convert_linear
from qerl.profiling.archs import qwen25_config

__all__ = ["build_random_model", "random_base"]

_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _init_(module: nn.Module, gen: torch.Generator) -> None:
    for name, p in module.named_parameters(recurse=False):
        if name == "bias":
            p.data.normal_(0.0, 0.02, generator=gen)
        elif p.dim() >= 2:
            p.data.normal_(0.0, 0.02, generator=gen)


def random_base(arch, weights: str = "bf16", *, layers: int | None = None, device="cuda",
                dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    """The Qwen2.5-`arch` architecture with random weights, its linear layers in `weights` format.

    Args:
        arch: a name of qerl.profiling.archs.ARCHS, or a transformers Qwen2Config (any Qwen2 shape; `layers`
            then does not apply).
        weights: "bf16" (kept in `dtype`), "nvfp4", "mxfp4" or "nf4".
        layers: build only this many decoder layers (tests).
        device: where the weights live.
        dtype: compute dtype (embeddings, norms, LM head, activations).
        seed: the random weights' seed.

    Returns:
        A transformers Qwen2ForCausalLM in eval mode, all parameters frozen.
    """
    from transformers import Qwen2ForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm, Qwen2RotaryEmbedding

    cfg = qwen25_config(arch, layers=layers) if isinstance(arch, str) else arch
    cfg._attn_implementation = "sdpa"
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    inner = model.model
    with torch.device(device):
        inner.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        inner.norm = Qwen2RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps).to(dtype)
        inner.rotary_emb = Qwen2RotaryEmbedding(cfg)
    inner.embed_tokens.weight.data.normal_(0.0, 0.02, generator=gen)
    for i in range(cfg.num_hidden_layers):
        with torch.device(device):
            layer = Qwen2DecoderLayer(cfg, i).to(dtype)
        for mod in layer.modules():
            _init_(mod, gen)
        if weights != "bf16":
            for parent in (layer.self_attn, layer.mlp):
                for name in _TARGETS:
                    if hasattr(parent, name):
                        setattr(parent, name, convert_linear(getattr(parent, name), weights, dtype))
        inner.layers[i] = layer
    if cfg.tie_word_embeddings:
        model.lm_head.weight = inner.embed_tokens.weight
    else:
        with torch.device(device):
            model.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        model.lm_head.weight.data.normal_(0.0, 0.02, generator=gen)
    leftover = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if leftover:
        raise RuntimeError(f"random_base: tensors left on the meta device: {leftover[:5]}")
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def build_random_model(arch: str, method: str, *, rank: int = 32, layers: int | None = None, device="cuda",
                       dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    """A random-weight Qwen2.5-`arch` set up as `method` trains it (see the module docstring), by the policy core.

    Raises:
        ValueError: unknown method or architecture.
    """
    from qerl.policy import LoraSpec, build_policy

    meth = get_method(method)
    base = random_base(arch, meth.weights, layers=layers, device=device, dtype=dtype, seed=seed)
    lora = LoraSpec(rank=rank, alpha=2 * rank) if meth.trainable == "lora" else None
    return build_policy(method, base, lora=lora, dtype=dtype).model
