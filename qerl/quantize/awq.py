"""Activation-aware weight quantization (AWQ-style) for NVFP4 and MXFP4: per-input-channel scale search and folding.

Why: the paper quantizes its NVFP4/MXFP4 models with AWQ calibration (256 x 2048 tokens, weight-only). Scaling
input channel j of a weight by s_j (and its input by 1/s_j) leaves the full-precision product unchanged but gives the
salient channels (large |x|) more of the 4-bit grid. How (Lin et al. 2024, as in AutoAWQ):

  for each group of linears sharing one input x (per decoder layer):
      q/k/v      after input_layernorm           -> fold 1/s into input_layernorm.weight
      gate/up    after post_attention_layernorm  -> fold 1/s into post_attention_layernorm.weight
      o          after v (through attention)     -> fold 1/s into v_proj's output rows (and bias)
      down       after up (through act(gate)*up) -> fold 1/s into up_proj's output rows (and bias)
  s = mean_tokens(|x|) ** alpha, normalised by sqrt(max(s) * min(s)); alpha on a grid of `grid` points in [0, 1)
  (alpha = 0 is round-to-nearest, so the search never does worse than RTN on the calibration data); the loss is the
  mean squared error of the group's concatenated outputs x @ W^T versus (x / s) @ Q(W * s)^T, Q = quantize ->
  dequantize in the target format (each linear quantized on its own, with its own NVFP4 global scale).
  The chosen s is folded into the weights, after which plain round-to-nearest quantization (quantize_) follows.

Grouped-query attention: o's input channels are attention-head outputs; head h reads v's kv-head h // n_rep, so a
v-output channel feeds n_rep o-input channels. Folding is exact only if those share one scale, so the o-group
statistic is averaged over the query heads of each kv head and the scale is tied across them (AutoAWQ instead skips
o when v and o shapes differ).

Deviations from the paper / AutoAWQ: the loss is the group's linear outputs (AutoAWQ uses the attention-block or MLP
output for q/k/v and gate/up); no weight-magnitude term ("duo scaling") and no clipping search; calibration data is
the harness's own (config quantize.calibration), not OpenThoughts-114k.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from qerl.formats import FORMATS
from qerl.quantize.calibration import TARGET_GROUPS, layerwise_inputs

__all__ = ["AWQResult", "fake_quantize", "awq_scale", "search_group_scale", "calibrate", "apply_awq",
           "layer_errors", "save_scales", "load_scales"]

_PREV = {"qkv": "input_layernorm", "gate_up": "post_attention_layernorm", "o": "self_attn.v_proj",
         "down": "mlp.up_proj"}


@dataclass
class AWQResult:
    """What calibrate() found.

    Attributes:
        scales: "<layer prefix>.<group>" -> float32 [in_features of the group] per-input-channel scale.
        alphas: same keys -> the chosen alpha.
        losses: same keys -> calibration MSE for every alpha on the grid (index 0 = alpha 0 = RTN).
        fmt: the format the search targeted.
    """

    scales: dict[str, torch.Tensor] = field(default_factory=dict)
    alphas: dict[str, float] = field(default_factory=dict)
    losses: dict[str, list[float]] = field(default_factory=dict)
    fmt: str = "nvfp4"


def fake_quantize(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """quantize -> dequantize of `w` in `fmt` (float32 out); "nf4" goes through bitsandbytes (QLoRA settings).

    Raises:
        ValueError: unknown format or what the format rejects.
    """
    if fmt == "nf4":
        import bitsandbytes.functional as bnbf

        packed, state = bnbf.quantize_4bit(w.float().contiguous(), blocksize=64, compress_statistics=True,
                                           quant_type="nf4")
        return bnbf.dequantize_4bit(packed, state).float()
    if fmt not in FORMATS:
        raise ValueError(f"AWQ supports {sorted(FORMATS)}, got format {fmt!r}")
    mod = FORMATS[fmt]
    return mod.dequantize(mod.quantize(w.float()), torch.float32)


def awq_scale(x_mean: torch.Tensor, alpha: float) -> torch.Tensor:
    """AWQ's per-channel scale mean|x| ** alpha, normalised so that max * min = 1 (alpha = 0 gives all ones)."""
    s = x_mean.float().clamp(min=1e-4).pow(alpha).clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def _tie_gqa(v: torch.Tensor, n_kv: int, n_rep: int) -> torch.Tensor:
    """Average an o-input statistic over the query heads of each kv head and expand it back ([n_heads * hd])."""
    t = v.reshape(n_kv, n_rep, -1).mean(1, keepdim=True)
    return t.expand(n_kv, n_rep, t.shape[-1]).reshape(-1)


def _gqa_shape(model: nn.Module, layer: nn.Module) -> tuple[int, int] | None:
    """(n_kv, n_rep) when o's input is n_kv * n_rep heads of v's output width, else None (o is not scaled)."""
    v, o = layer.get_submodule(TARGET_GROUPS["qkv"][2]), layer.get_submodule(TARGET_GROUPS["o"][0])
    cfg = model.config
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    if o.in_features != n_heads * head_dim or v.out_features != n_kv * head_dim or n_heads % n_kv:
        return None
    return n_kv, n_heads // n_kv


@torch.no_grad()
def search_group_scale(x: torch.Tensor, weights: list[torch.Tensor], fmt: str, grid: int,
                       tie=None) -> tuple[torch.Tensor, float, list[float]]:
    """Grid-search alpha for one group of linears sharing the input `x`.

    Args:
        x: float32 [n_tokens, K] inputs of the group.
        weights: the group's weights, each [N_i, K].
        fmt: "nvfp4" or "mxfp4".
        grid: number of alphas, i / grid for i in range(grid).
        tie: optional function applied to the statistic (GQA tying for o).

    Returns:
        (best scale [K], best alpha, loss for every alpha).

    Raises:
        ValueError: grid < 1 or shapes that disagree.
    """
    if grid < 1:
        raise ValueError(f"awq_grid must be >= 1, got {grid}")
    if any(w.shape[-1] != x.shape[-1] for w in weights):
        raise ValueError(f"AWQ group: input width {x.shape[-1]} vs weights {[tuple(w.shape) for w in weights]}")
    x_mean = x.abs().mean(0)
    if tie is not None:
        x_mean = tie(x_mean)
    w_cat = torch.cat([w.float() for w in weights])
    ref = x @ w_cat.T
    losses, best = [], (math.inf, None, 0.0)
    for i in range(grid):
        alpha = i / grid
        s = awq_scale(x_mean, alpha)
        wq = torch.cat([fake_quantize(w.float() * s, fmt) for w in weights])
        loss = (((x / s) @ wq.T - ref) ** 2).mean().item()
        losses.append(loss)
        if loss < best[0]:
            best = (loss, s, alpha)
    return best[1], best[2], losses


@torch.no_grad()
def _fold(layer: nn.Module, group: str, s: torch.Tensor, gqa: tuple[int, int] | None) -> None:
    """Fold scale `s` of `group` into the layer: W *= s (columns) for the group, prev /= s; function unchanged."""
    for name in TARGET_GROUPS[group]:
        lin = layer.get_submodule(name)
        lin.weight.mul_(s.to(lin.weight.dtype)[None, :])
    prev = layer.get_submodule(_PREV[group])
    if group == "o":
        n_kv, n_rep = gqa
        s_prev = s.reshape(n_kv, n_rep, -1)[:, 0].reshape(-1)  # one scale per v output channel
    else:
        s_prev = s
    if isinstance(prev, nn.Linear):  # v -> o, up -> down: scale the output rows
        prev.weight.div_(s_prev.to(prev.weight.dtype)[:, None])
        if prev.bias is not None:
            prev.bias.div_(s_prev.to(prev.bias.dtype))
    else:  # RMSNorm (weight only; these models' norms have no bias)
        if getattr(prev, "bias", None) is not None:
            prev.bias.div_(s_prev.to(prev.bias.dtype))
        prev.weight.div_(s_prev.to(prev.weight.dtype))


def _layer_groups(model: nn.Module, layer: nn.Module) -> list[tuple[str, tuple[int, int] | None]]:
    gqa = _gqa_shape(model, layer)
    return [(g, gqa) for g in TARGET_GROUPS if g != "o" or gqa is not None]


@torch.no_grad()
def calibrate(model: nn.Module, tokens: torch.Tensor, fmt: str, grid: int, batch_size: int = 8,
              apply: bool = True) -> AWQResult:
    """Search AWQ scales for every decoder layer of `model` and (by default) fold them in.

    Args:
        model: a transformers causal LM with Qwen2/Llama decoder layers (float32 recommended).
        tokens: LongTensor [n_seq, seq_len] calibration sequences.
        fmt: "nvfp4" or "mxfp4".
        grid: awq_grid points over alpha in [0, 1).
        batch_size: sequences per forward.
        apply: fold the found scales into the model (in place) as they are found.

    Returns:
        AWQResult with the scales, the chosen alphas and the loss curves.

    Raises:
        ValueError: unknown format or a model without decoder layers at model.model.layers.
    """
    if fmt not in FORMATS:
        raise ValueError(f"AWQ supports {sorted(FORMATS)}, got format {fmt!r}")
    result = AWQResult(fmt=fmt)
    for i, layer, inputs in layerwise_inputs(model, tokens, batch_size):
        for group, gqa in _layer_groups(model, layer):
            weights = [layer.get_submodule(n).weight for n in TARGET_GROUPS[group]]
            tie = (lambda v, g=gqa: _tie_gqa(v, *g)) if group == "o" else None
            s, alpha, losses = search_group_scale(inputs[group], weights, fmt, grid, tie)
            key = f"model.layers.{i}.{group}"
            result.scales[key], result.alphas[key], result.losses[key] = s, alpha, losses
            if apply:
                _fold(layer, group, s, gqa)
    return result


@torch.no_grad()
def apply_awq(model: nn.Module, scales: dict[str, torch.Tensor]) -> nn.Module:
    """Fold previously found scales (AWQResult.scales or load_scales()) into `model`, in place.

    Raises:
        ValueError: a key that names no layer/group of this model, or a scale of the wrong width.
    """
    layers = model.model.layers
    for key, s in scales.items():
        try:
            _, _, idx, group = key.split(".")
            layer = layers[int(idx)]
        except (ValueError, IndexError):
            raise ValueError(f"AWQ scale key {key!r} does not name model.layers.<i>.<group> of this model") from None
        if group not in TARGET_GROUPS:
            raise ValueError(f"AWQ scale key {key!r}: unknown group {group!r}; known: {list(TARGET_GROUPS)}")
        width = layer.get_submodule(TARGET_GROUPS[group][0]).in_features
        if s.numel() != width:
            raise ValueError(f"AWQ scale {key!r} has {s.numel()} channels, the layer has {width} inputs")
        gqa = _gqa_shape(model, layer) if group == "o" else None
        if group == "o" and gqa is None:
            raise ValueError(f"AWQ scale {key!r}: this model's v/o shapes do not allow folding into v_proj")
        _fold(layer, group, s.float(), gqa)
    return model


@torch.no_grad()
def layer_errors(model: nn.Module, tokens: torch.Tensor, fmt: str, scales: dict[str, torch.Tensor] | None = None,
                 batch_size: int = 8) -> dict[str, float]:
    """Relative output error ||Q(W) x - W x|| / ||W x|| of every target linear on `tokens` (held-out activations).

    With `scales` (AWQ), each linear is quantized as it would be after folding: W' = diag(1/r) W diag(s), input
    x / s, and its error is measured back in the original coordinates (times r, where r is the scale folded into
    its output rows: v_proj by o's scale, up_proj by down's), so RTN and AWQ errors are directly comparable.

    Args:
        model: the ORIGINAL (unfolded, unquantized) model.
        tokens: LongTensor [n_seq, seq_len] held-out sequences.
        fmt: "nvfp4" or "mxfp4".
        scales: AWQ scales (AWQResult.scales), or None for round-to-nearest.
        batch_size: sequences per forward.

    Returns:
        "model.layers.<i>.<linear name>" -> relative error.
    """
    scales = scales or {}
    errors = {}
    out_group = {TARGET_GROUPS["qkv"][2]: "o", TARGET_GROUPS["gate_up"][1]: "down"}
    for i, layer, inputs in layerwise_inputs(model, tokens, batch_size):
        gqa = _gqa_shape(model, layer)
        for group, names in TARGET_GROUPS.items():
            x = inputs[group]
            s = scales.get(f"model.layers.{i}.{group}")
            for name in names:
                w = layer.get_submodule(name).weight.float()
                ref = x @ w.T
                r = None
                if name in out_group and f"model.layers.{i}.{out_group[name]}" in scales:
                    r = scales[f"model.layers.{i}.{out_group[name]}"].float()
                    if out_group[name] == "o":
                        r = r.reshape(gqa[0], gqa[1], -1)[:, 0].reshape(-1)
                w2, x2 = w, x
                if s is not None:
                    w2, x2 = w2 * s[None, :], x / s
                if r is not None:
                    w2 = w2 / r[:, None]
                out = x2 @ fake_quantize(w2, fmt).T
                if r is not None:
                    out = out * r
                errors[f"model.layers.{i}.{name}"] = ((out - ref).norm() / ref.norm().clamp(min=1e-12)).item()
    return errors


def save_scales(result: AWQResult, path) -> None:
    """Write AWQ scales as safetensors (tensor per "<layer>.<group>"), alphas and format in the metadata."""
    import json

    from safetensors.torch import save_file

    meta = {"format": result.fmt, "alphas": json.dumps(result.alphas), "losses": json.dumps(result.losses)}
    save_file({k: v.detach().cpu().contiguous().float() for k, v in result.scales.items()}, str(path), metadata=meta)


def load_scales(path) -> AWQResult:
    """Read what save_scales wrote.

    Raises:
        ValueError: the file is not an AWQ scales file.
    """
    import json

    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if "format" not in meta:
            raise ValueError(f"{path}: not an AWQ scales file (no 'format' in its safetensors metadata)")
        scales = {k: f.get_tensor(k) for k in f.keys()}
    return AWQResult(scales, json.loads(meta.get("alphas", "{}")), json.loads(meta.get("losses", "{}")),
                     meta["format"])
