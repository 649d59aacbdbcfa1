"""Load a model for evaluation: a checkpoint folder, then a weight format, then (optionally) a LoRA adapter.

Why one loader: the Table 1/2 rows without training are the base model in BF16, NF4, MXFP4 and NVFP4; the trained
rows are the same formats plus the run's adapter. Loading them all through one function means every row is built
the same way: `AutoModelForCausalLM.from_pretrained(dir)` in `dtype`, then the linear layers q/k/v/o/gate/up/down
converted with the quantization API (`qerl.layers.quantize_` with NVFP4Config / MXFP4Config; bitsandbytes NF4
through `baselines.nf4.quantize_nf4_`), then `peft.PeftModel.from_pretrained(model, adapter_dir)` with QuantLinear
registered (so the adapter wraps the 4-bit layers exactly as in training).

Formats: "bf16" means the unquantized weights in `dtype` (the paper's BF16 row; on CPU the tiny and small scales
compute in float32, see model.dtype in the config). "nvfp4" / "mxfp4" here are round-to-nearest conversions of the
loaded weights. The paper's NVFP4/MXFP4 rows are AWQ-calibrated: pass `quantized=` the folder the quantization
stage wrote (compressed-tensors layout, or an NF4 recipe; read by `qerl.quantize.checkpoint.load_quantized`) to
evaluate that checkpoint instead; the tokenizer still comes from the base folder. Every results JSON says which
quantization it used (`info["quantization"]`).

Usage::

    model, tokenizer, info = load_model("results/tiny/models/tiny/base", fmt="nvfp4", adapter="runs/.../adapter")
    model, tokenizer, info = load_model(base_dir, fmt="nvfp4", quantized="results/tiny/quantized/tiny/nvfp4")

Run the tests: ``pytest tests/evaluate/test_load.py -q``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMATS", "DTYPES", "load_tokenizer", "load_base", "apply_format", "load_adapter", "checkpoint_format",
           "load_model"]

FORMATS = ("bf16", "nf4", "mxfp4", "nvfp4")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"config key 'model.dtype': unknown dtype {dtype!r}; known: {sorted(DTYPES)}")
    return DTYPES[dtype]


_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(model_dir: str | Path):
    """The tokenizer saved in `model_dir`, exactly as saved.

    Why not plain AutoTokenizer: in transformers 5 a folder whose tokenizer_config.json says the generic
    "TokenizersBackend" (what our tiny WordPiece tokenizer and the GGUF-converted SmolLM2 tokenizer save as) is
    loaded with the model type's own class (Qwen2Tokenizer for the tiny Qwen2), which rebuilds the pre-tokenizer
    and decoder: the tiny tokenizer then encodes "13" as other ids and decodes without spaces. For those folders
    the generic class is used, which reads tokenizer.json unchanged.

    Args:
        model_dir: a folder with tokenizer files.

    Returns:
        The tokenizer, with pad_token set to eos_token when it had none.
    """
    import json

    from transformers import AutoTokenizer

    path = Path(model_dir)
    config = path / "tokenizer_config.json"
    declared = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if declared in _GENERIC_TOKENIZERS and (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_base(model_dir: str | Path, dtype: str | torch.dtype = "float32", device: str = "cpu"):
    """A transformers causal LM and its tokenizer from a checkpoint folder (no network).

    Args:
        model_dir: folder with config.json, weights and tokenizer files.
        dtype: "float32", "bfloat16", "float16" or a torch dtype.
        device: where to put the model.

    Returns:
        (model in eval mode, tokenizer with a pad token).

    Raises:
        ValueError: the folder does not exist or has no config.json, or an unknown dtype.
    """
    from transformers import AutoModelForCausalLM

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise ValueError(f"--base {str(path)!r}: not a checkpoint folder (no config.json there)")
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype), local_files_only=True)
    model.to(device).eval()
    return model, tokenizer


def apply_format(model, fmt: str, targets: tuple[str, ...] | None = None):
    """Convert the model's target linears to `fmt`, in place (bf16: nothing to do).

    Args:
        model: an unquantized transformers model.
        fmt: one of FORMATS.
        targets: last name components of the layers to quantize (default: q/k/v/o/gate/up/down).

    Returns:
        The same model.

    Raises:
        ValueError: unknown format, or a layer that cannot be converted (named by quantize_).
        RuntimeError: NF4 requested and bitsandbytes cannot quantize on this device.
    """
    from qerl.layers import DEFAULT_TARGETS, MXFP4Config, NVFP4Config, quantize_

    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: unknown weight format; known: {list(FORMATS)}")
    targets = tuple(targets or DEFAULT_TARGETS)
    if fmt == "nvfp4":
        quantize_(model, NVFP4Config(targets=targets))
    elif fmt == "mxfp4":
        quantize_(model, MXFP4Config(targets=targets))
    elif fmt == "nf4":
        from baselines.nf4 import NF4Config, quantize_nf4_

        quantize_nf4_(model, NF4Config(targets=targets))
    model.eval()
    return model


def load_adapter(model, adapter_dir: str | Path):
    """Wrap `model` in its trained peft LoRA adapter (QuantLinear layers registered), inference mode.

    Args:
        model: the base model, already in its weight format.
        adapter_dir: folder with adapter_config.json and adapter weights (peft's save_pretrained).

    Returns:
        The peft.PeftModel.

    Raises:
        ValueError: the folder has no adapter_config.json.
    """
    from peft import PeftConfig, PeftModel

    from qerl.layers.lora import register_quant_linear

    path = Path(adapter_dir)
    if not (path / "adapter_config.json").is_file():
        raise ValueError(f"--adapter {str(path)!r}: not a peft adapter folder (no adapter_config.json there)")
    config = PeftConfig.from_pretrained(str(path))
    if hasattr(config, "_register_custom_module"):
        register_quant_linear(config)
    peft_model = PeftModel.from_pretrained(model, str(path), config=config, is_trainable=False)
    peft_model.eval()
    return peft_model


def checkpoint_format(model) -> str:
    """The weight format of a loaded model: nvfp4 / mxfp4 (QuantLinear), nf4 (bitsandbytes 4-bit) or bf16 (neither).

    Raises:
        ValueError: if it mixes formats.
    """
    from qerl.layers import QuantLinear

    found = set()
    for m in model.modules():
        if isinstance(m, QuantLinear):
            found.add(m.fmt)
        elif type(m).__name__ == "Linear4bit":
            found.add("nf4")
    if len(found) > 1:
        raise ValueError(f"the model mixes weight formats {sorted(found)}")
    return found.pop() if found else "bf16"


def load_model(model_dir: str | Path, fmt: str = "bf16", adapter: str | Path | None = None,
               dtype: str | torch.dtype = "float32", device: str = "cpu",
               targets: tuple[str, ...] | None = None, quantized: str | Path | None = None) -> tuple[Any, Any, dict]:
    """Base checkpoint -> weight format (or a quantized checkpoint) -> optional adapter.

    Args:
        model_dir: checkpoint folder of the base model (its tokenizer is always used).
        fmt: "bf16" (unquantized, in `dtype`), "nf4", "mxfp4" or "nvfp4".
        adapter: peft adapter folder, or None.
        dtype: dtype of the unquantized weights and of activations.
        device: where the model runs.
        targets: layers to quantize (default q/k/v/o/gate/up/down).
        quantized: a folder written by the quantization stage; its weights replace the round-to-nearest
            conversion, and its format must be `fmt`.

    Returns:
        (model, tokenizer, info) where info records what was loaded (paths, format, dtype, quantization,
        parameter and byte counts) for the results JSON.

    Raises:
        ValueError: bad folder, format, dtype or adapter folder; a quantized checkpoint of another format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: unknown weight format; known: {list(FORMATS)}")
    if quantized is None:
        model, tokenizer = load_base(model_dir, dtype, device)
        apply_format(model, fmt, targets)
        how = {"bf16": "none", "nf4": "bitsandbytes NF4 (blocksize 64, double quant)"}.get(
            fmt, f"{fmt} round-to-nearest at load time (no AWQ scaling)")
    else:
        from qerl.quantize.checkpoint import load_quantized

        if not (Path(model_dir) / "config.json").is_file():
            raise ValueError(f"--base {str(model_dir)!r}: not a checkpoint folder (no config.json there)")
        tokenizer = load_tokenizer(model_dir)
        model = load_quantized(quantized, _dtype(dtype), device)
        found = checkpoint_format(model)
        if found != fmt:
            raise ValueError(f"--quantized {str(quantized)!r} holds {found} weights, but --format is {fmt!r}")
        how = f"{fmt} checkpoint {quantized}"
    if adapter is not None:
        model = load_adapter(model, adapter)
    from qerl.layers import model_nbytes

    nbytes = model_nbytes(model)
    if fmt == "nf4":
        from baselines.nf4 import nf4_nbytes

        nbytes = nf4_nbytes(model)
    info = {
        "model_dir": str(model_dir),
        "format": fmt,
        "quantization": how,
        "quantized_dir": None if quantized is None else str(quantized),
        "adapter": None if adapter is None else str(adapter),
        "dtype": str(_dtype(dtype)).removeprefix("torch."),
        "device": str(device),
        "nbytes": int(nbytes),
    }
    return model, tokenizer, info
