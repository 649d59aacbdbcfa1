"""Save and load quantized models in compressed-tensors' layout (what llm-compressor writes and vLLM loads).

The quantization stage writes these folders (`qerl quantize`); the policy core reads them (`build_policy(...,
quantized=DIR)`) for the trainer and the evaluator, which is why this module lives in qerl.policy.

Why this layout: the paper serves rollouts with vLLM from an NVFP4 checkpoint; writing the same files lets the paper
scale hand our quantized models to vLLM unchanged, and lets compressed-tensors' own decompressor check us (tests).

Files (one folder):
    config.json        the model's transformers config + "quantization_config" (below)
    model.safetensors  per quantized linear <prefix>:
                         <prefix>.weight_packed        uint8 [out, in // 2]   (element 2j in the low nibble)
                         <prefix>.weight_scale         NVFP4: float8_e4m3fn [out, in // 16];
                                                       MXFP4: uint8 E8M0 [out, in // 32]
                         <prefix>.weight_global_scale  NVFP4 only: float32 [1] = 1 / our global_scale (448 * 6 / amax)
                         <prefix>.bias                 when the layer has one
                       and every other tensor as in a plain transformers checkpoint (a tied lm_head is not stored).
    quantization_config = {quant_method: "compressed-tensors", format: "nvfp4-pack-quantized" | "mxfp4-pack-quantized",
                           quantization_status: "compressed", config_groups: {group_0: {targets: ["Linear"],
                           weights: <compressed-tensors preset NVFP4A16 / MXFP4A16 weight args>}},
                           ignore: [every nn.Linear left unquantized, e.g. "lm_head"], ...}
MXFP4 uses compressed-tensors' own "mxfp4-pack-quantized" format (MXFP4A16 preset: group 32, uint8 E8M0 scales, no
global scale); whether a given vLLM version serves it is vLLM's business.

The global scale is the one conversion: compressed-tensors stores the quantization-direction scale 448 * 6 / amax,
we hold its reciprocal (a dequantization multiplier). Each direction rounds once to float32, so a save/load round trip
reproduces the global scale to within one float32 ulp (tested), not always bit for bit.

NF4 (bitsandbytes) is not a compressed-tensors format: `save_nf4_recipe` writes a small JSON naming the base
checkpoint and QLoRA's bitsandbytes settings, and `load_quantized` re-quantizes at load time through transformers'
bitsandbytes loader (deterministic: the same codes every time).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from qerl.io import atomic_dir, write_text
from qerl.layers import QuantLinear

__all__ = ["CT_FORMATS", "quantization_config", "save_quantized", "load_quantized", "save_nf4_recipe",
           "state_dict_ct"]

CT_FORMATS = {"nvfp4": "nvfp4-pack-quantized", "mxfp4": "mxfp4-pack-quantized"}
_WEIGHT_ARGS = {  # compressed-tensors presets NVFP4A16 / MXFP4A16, as QuantizationConfig.model_dump() writes them
    "nvfp4": {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
              "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"},
    "mxfp4": {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 32, "strategy": "group",
              "dynamic": False, "scale_dtype": "torch.uint8"},
}
NF4_RECIPE = "nf4_recipe.json"


def _formats_of(model: nn.Module) -> set[str]:
    return {m.fmt for m in model.modules() if isinstance(m, QuantLinear)}


def quantization_config(fmt: str, ignore: list[str]) -> dict:
    """The compressed-tensors quantization_config for a model whose linears are `fmt` except those in `ignore`.

    Raises:
        ValueError: unknown format.
    """
    if fmt not in CT_FORMATS:
        raise ValueError(f"compressed-tensors layout exists for {sorted(CT_FORMATS)}, not {fmt!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        ct_version = version("compressed-tensors")
    except PackageNotFoundError:
        ct_version = None
    return {
        "quant_method": "compressed-tensors",
        "format": CT_FORMATS[fmt],
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": dict(_WEIGHT_ARGS[fmt]),
                                      "input_activations": None, "output_activations": None,
                                      "format": CT_FORMATS[fmt]}},
        "ignore": sorted(ignore),
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "transform_config": {},
        "version": ct_version,
    }


def state_dict_ct(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors under compressed-tensors names (tied duplicates dropped, contiguous CPU tensors)."""
    out: dict[str, torch.Tensor] = {}
    quant_prefixes = {}
    for name, m in model.named_modules():
        if isinstance(m, QuantLinear):
            quant_prefixes[name] = m
            out[f"{name}.weight_packed"] = m.codes
            out[f"{name}.weight_scale"] = m.scales
            if m.fmt == "nvfp4":
                gs = m.global_scale.double()
                out[f"{name}.weight_global_scale"] = (1.0 / gs).float().reshape(1)
    seen = {t.untyped_storage().data_ptr() for t in out.values()}
    for key, t in model.state_dict().items():
        prefix = key.rpartition(".")[0]
        if prefix in quant_prefixes and not key.endswith(".bias"):
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel() > 0:  # tied weights (lm_head = embed_tokens): keep the first name
            continue
        seen.add(ptr)
        out[key] = t
    return {k: v.detach().to("cpu").contiguous() for k, v in out.items()}


def save_quantized(model: nn.Module, out_dir: str | Path, tokenizer=None) -> Path:
    """Write `model` (with QuantLinear layers of one format) as a compressed-tensors checkpoint folder.

    The folder appears atomically (written beside, then renamed); an existing folder is replaced.

    Args:
        model: a transformers model after quantize_ (NVFP4Config or MXFP4Config).
        out_dir: destination folder.
        tokenizer: optional tokenizer saved alongside.

    Returns:
        The folder.

    Raises:
        ValueError: the model has no QuantLinear or mixes formats.
    """
    from safetensors.torch import save_file

    fmts = _formats_of(model)
    if len(fmts) != 1:
        raise ValueError(f"save_quantized: expected QuantLinear layers of exactly one format, found {sorted(fmts)}")
    fmt = fmts.pop()
    ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        save_file(state_dict_ct(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config["quantization_config"] = quantization_config(fmt, ignore)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return out_dir


def save_nf4_recipe(base_dir: str | Path, out_dir: str | Path, compute_dtype: str = "bfloat16") -> Path:
    """Write out_dir/nf4_recipe.json: NF4 is re-created from `base_dir` at load time (see module docstring)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    recipe = {"format": "nf4", "base": str(Path(base_dir).resolve()), "quant_type": "nf4", "blocksize": 64,
              "double_quant": True, "compute_dtype": compute_dtype, "skip_modules": ["lm_head"]}
    write_text(out_dir / NF4_RECIPE, json.dumps(recipe, indent=1))
    return out_dir


def load_quantized(model_dir: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
    """Load a folder written by save_quantized (or by llm-compressor, NVFP4A16/MXFP4A16), or an NF4 recipe.

    Args:
        model_dir: the folder.
        dtype: compute dtype of the unquantized parts (default: the config's dtype, else float32; for NF4 the
            recipe's compute dtype).
        device: where to put the model.

    Returns:
        A transformers model whose quantized linears are QuantLinear (bitsandbytes Linear4bit for NF4).

    Raises:
        ValueError: missing files, or a quantization_config that is not compressed-tensors NVFP4/MXFP4 pack-quantized
            (the message names the file and the value seen).
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    if (model_dir / NF4_RECIPE).is_file():
        return _load_nf4(model_dir / NF4_RECIPE, dtype, device)
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{model_dir}: no config.json (nor {NF4_RECIPE})")
    raw = json.loads(cfg_path.read_text())
    qc = raw.get("quantization_config")
    fmt = _check_qc(qc, cfg_path)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    raw.pop("quantization_config")
    config = AutoConfig.for_model(**raw) if "model_type" in raw else None
    if config is None:
        raise ValueError(f"{cfg_path}: no model_type")
    if dtype is None:
        dtype = getattr(config, "dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    # the modules on the meta device: no memory and no random initialization of weights the checkpoint replaces
    # (on the CPU, initializing a 7B's linears took ~230 s of a ~250 s load: paper-scale run 4)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    prefixes = [k[: -len(".weight_packed")] for k in tensors if k.endswith(".weight_packed")]
    for prefix in prefixes:
        parent_name, _, child = prefix.rpartition(".")
        try:
            old = model.get_submodule(prefix)
        except AttributeError:
            raise ValueError(f"{model_dir}: tensor {prefix}.weight_packed names no module of this model") from None
        packed = _packed_from_ct(tensors, prefix, fmt, old.out_features, old.in_features, dtype, model_dir)
        bias = tensors.pop(f"{prefix}.bias", None)
        layer = QuantLinear.from_packed(packed, bias, dtype=dtype)
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
    wanted = model.state_dict()  # the meta tensors' dtypes: assign=True would keep the checkpoint's
    tensors = {k: v.to(wanted[k].dtype) if k in wanted and v.is_floating_point() else v for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    missing = [k for k in missing if k.rpartition(".")[0] not in prefixes]
    if unexpected or missing:
        raise ValueError(f"{model_dir}: checkpoint does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.tie_weights()
    _build_meta_buffers(model, config, model_dir)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{model_dir}: the checkpoint leaves {left[:5]} without values")
    return model.to(device).eval()


def _build_meta_buffers(model: nn.Module, config, where) -> None:
    """Give the meta-built model's non-persistent buffers (rotary inv_freq: computed from the config, not saved)
    their values, by building each owning module again from the config alone.

    Raises:
        ValueError: a module with such buffers that cannot be built from the config (names the module).
    """
    for name, module in model.named_modules():
        empty = [n for n, b in module.named_buffers(recurse=False) if b is not None and b.is_meta]
        if not empty:
            continue
        try:
            fresh = type(module)(config=config)
        except TypeError as e:
            raise ValueError(f"{where}: cannot compute the buffers {empty} of {name or 'the model'} "
                             f"({type(module).__name__}) from the config: {e}") from None
        for n in empty:
            setattr(module, n, getattr(fresh, n))


def _check_qc(qc, where) -> str:
    if not isinstance(qc, dict):
        raise ValueError(f"{where}: no quantization_config")
    if qc.get("quant_method") != "compressed-tensors":
        raise ValueError(f"{where}: quantization_config.quant_method is {qc.get('quant_method')!r}, "
                         "expected 'compressed-tensors'")
    fmt = {v: k for k, v in CT_FORMATS.items()}.get(qc.get("format"))
    if fmt is None:
        raise ValueError(f"{where}: quantization_config.format is {qc.get('format')!r}; supported: "
                         f"{sorted(CT_FORMATS.values())}")
    for name, group in qc.get("config_groups", {}).items():
        w = group.get("weights") or {}
        want = _WEIGHT_ARGS[fmt]
        for key in ("num_bits", "type", "group_size", "symmetric"):
            if w.get(key) != want[key]:
                raise ValueError(f"{where}: config_groups.{name}.weights.{key} is {w.get(key)!r}, "
                                 f"expected {want[key]!r} for {qc['format']}")
        if group.get("input_activations"):
            raise ValueError(f"{where}: config_groups.{name} quantizes activations; only weight-only "
                             "(A16) checkpoints are supported")
    return fmt


def _packed_from_ct(tensors, prefix, fmt, out_features, in_features, dtype, where):
    from qerl.formats import MXFP4Tensor, NVFP4Tensor, mxfp4, nvfp4

    codes = tensors.pop(f"{prefix}.weight_packed")
    scale = tensors.pop(f"{prefix}.weight_scale")
    block = nvfp4.BLOCK_SIZE if fmt == "nvfp4" else mxfp4.BLOCK_SIZE
    if tuple(codes.shape) != (out_features, in_features // 2) or \
            tuple(scale.shape) != (out_features, in_features // block):
        raise ValueError(f"{where}: {prefix}: weight_packed {tuple(codes.shape)} / weight_scale "
                         f"{tuple(scale.shape)} do not fit a ({out_features}, {in_features}) {fmt} weight")
    shape = torch.Size((out_features, in_features))
    if fmt == "nvfp4":
        ct_gs = tensors.pop(f"{prefix}.weight_global_scale")
        gs = (1.0 / ct_gs.double().reshape(())).float()
        return NVFP4Tensor(codes.to(torch.uint8), scale.to(torch.float8_e4m3fn), gs, shape, dtype)
    if scale.dtype != torch.uint8:
        raise ValueError(f"{where}: {prefix}.weight_scale has dtype {scale.dtype}, expected uint8 E8M0 exponents")
    return MXFP4Tensor(codes.to(torch.uint8), scale, shape, dtype)


def _load_nf4(recipe_path: Path, dtype, device):
    from transformers import AutoModelForCausalLM

    from baselines.nf4 import bnb_config, keep_trainable_layout

    recipe = json.loads(recipe_path.read_text())
    dtype = dtype or getattr(torch, recipe.get("compute_dtype", "bfloat16"))
    if not (Path(recipe["base"]) / "config.json").is_file():
        raise ValueError(f"{recipe_path}: base checkpoint {recipe['base']!r} has no config.json")
    model = AutoModelForCausalLM.from_pretrained(recipe["base"], quantization_config=bnb_config(dtype), dtype=dtype,
                                                 device_map={"": str(device)})
    return keep_trainable_layout(model).eval()
