"""Calibration data and the layer-by-layer activation capture that AWQ and the error measurements run on.

Why layer by layer: AWQ needs the inputs of every quantized linear. Holding all of them for a whole model at once
costs n_tokens x (3 * hidden + intermediate) floats per decoder layer, for every layer; instead the decoder layers
run one at a time over all calibration sequences (as AutoAWQ does): the inputs of layer i are captured, handed to
the caller, and dropped before layer i + 1 runs. Because AWQ's scale folding leaves the full-precision function
unchanged, running the original (unfolded) layers gives the same activations the folded model would see.

Texts: each JSONL row becomes the chat-templated prompt (config prompt.instruction) plus its worked completion in
the paper's <think>/<answer> format, i.e. what the policy reads and writes during RL (or plain "question\\nanswer"
text); the texts are tokenized and concatenated with the tokenizer's EOS between them and cut into fixed-length
chunks, and `n` chunks are drawn with a seeded generator (the paper uses 256 x 2048 tokens of OpenThoughts).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn

from qerl.quantize.dag import calibration_file

__all__ = ["read_texts", "token_chunks", "calibration_tokens", "decoder_layers", "layerwise_inputs", "TARGET_GROUPS"]

# Linear layers whose inputs are captured, by the group that shares that input (AWQ's grouping).
TARGET_GROUPS = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}


def read_texts(path: str | Path, limit: int | None = None, tokenizer=None, instruction: str | None = None,
               completion: bool = True) -> list[str]:
    """Texts of a JSONL file of problems, one per row.

    Without `instruction`: "question\nanswer" (or "problem\nsolution"), plain text. With `instruction` ("paper" or
    "none", config prompt.instruction) and a tokenizer that has a chat template: what the RL policy actually reads
    and writes, i.e. the chat-templated prompt followed by the completion "<think> steps </think> <answer> N
    </answer>" (the tiny model is pretrained on exactly that; plain text is out of its distribution).

    Args:
        path: JSONL file (GSM8K format, the tiny scale's generated rows, or MATH rows).
        limit: keep at most this many rows (file order).
        tokenizer: needed with `instruction`.
        instruction: None for plain text, else the prompt instruction.
        completion: with `instruction`, False returns the prompts alone.

    Returns:
        One string per row.

    Raises:
        ValueError: naming file:line for a row without a question/problem string; a tokenizer without a chat
            template when `instruction` is given.
    """
    from qerl.data.benchmarks import load_jsonl

    texts = []
    for i, row in enumerate(load_jsonl(path)[:limit], start=1):
        q = row.get("question", row.get("problem"))
        a = row.get("answer", row.get("solution", ""))
        if not isinstance(q, str) or not isinstance(a, str):
            raise ValueError(f"{path}:{i}: expected string fields 'question'/'answer' (or 'problem'/'solution'), "
                             f"got keys {sorted(row)}")
        if instruction is None:
            texts.append(f"{q}\n{a}")
            continue
        from qerl.data.prompts import build_prompt

        if "####" in a:  # GSM8K format: worked steps, then the final answer
            steps, _, final = a.rpartition("####")
        else:  # MATH format: the solution is the reasoning, `answer` (if any) the final answer
            steps, final = row.get("solution", a), row.get("answer", "")
        prompt = build_prompt(q, tokenizer, instruction)
        texts.append(prompt + f"<think> {steps.strip()} </think> <answer> {str(final).strip()} </answer>"
                     if completion else prompt)
    return texts


def token_chunks(texts: list[str], tokenizer, n: int, seq_len: int, seed: int, exclude: int = 0) -> torch.Tensor:
    """`n` token chunks of `seq_len` drawn (seeded, without replacement) from the concatenated texts.

    Args:
        texts: the documents.
        tokenizer: a transformers tokenizer (its eos_token_id separates documents when it has one).
        n: number of chunks.
        seq_len: tokens per chunk.
        seed: generator seed for which chunks are drawn.
        exclude: skip the first `exclude` chunks of the shuffled order (draw a held-out set disjoint from a
            calibration set drawn with the same seed and n = exclude).

    Returns:
        LongTensor [n, seq_len].

    Raises:
        ValueError: the texts hold fewer than n + exclude chunks (the message gives the token count).
    """
    return _draw_chunks(_concatenated_ids(texts, tokenizer), n, seq_len, seed, exclude)


def _concatenated_ids(texts: list[str], tokenizer) -> list[int]:
    """The texts' token ids, one after another, each followed by the tokenizer's EOS when it has one."""
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
    return ids


def _draw_chunks(ids: list[int], n: int, seq_len: int, seed: int, exclude: int) -> torch.Tensor:
    """token_chunks' draw from already concatenated ids."""
    if n < 1 or seq_len < 1:
        raise ValueError(f"token_chunks: n and seq_len must be positive, got n={n}, seq_len={seq_len}")
    total = len(ids) // seq_len
    if total < n + exclude:
        raise ValueError(f"calibration texts give {len(ids)} tokens = {total} chunks of {seq_len}, "
                         f"but {n + exclude} are needed (n={n}, exclude={exclude}); lower n or seq_len or add texts")
    chunks = torch.tensor(ids[: total * seq_len], dtype=torch.long).view(total, seq_len)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    return chunks[order[exclude: exclude + n]]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM (Qwen2, Llama and their relatives: model.model.layers).

    Raises:
        ValueError: the model has no such list.
    """
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__}: expected decoder layers at model.model.layers")
    return layers


class _Stop(Exception):
    pass


@torch.no_grad()
def layerwise_inputs(model: nn.Module, tokens: torch.Tensor, batch_size: int = 8,
                     groups: dict[str, tuple[str, ...]] = TARGET_GROUPS
                     ) -> Iterator[tuple[int, nn.Module, dict[str, torch.Tensor]]]:
    """Run the decoder layers one at a time over `tokens`; yield each layer with the inputs of its groups.

    Args:
        model: a transformers causal LM (left in eval mode, unchanged by this function).
        tokens: LongTensor [n_seq, seq_len] (all sequences the same length, no padding).
        batch_size: sequences per forward.
        groups: group name -> linear names inside a decoder layer; the input of the first one is captured.

    Yields:
        (layer index, the layer, {group: float32 [n_seq * seq_len, in_features]}). The caller may modify the layer
        function-preservingly (AWQ folding) before asking for the next one.
    """
    model.eval()
    layers = decoder_layers(model)
    batches = list(tokens.split(batch_size))
    # 1. per-layer keyword arguments (masks, rotary embeddings, ...) from one sequence; they broadcast over batches.
    layer_kwargs: list[dict] = [{} for _ in layers]

    def grab_kwargs(i):
        def hook(module, args, kwargs):
            layer_kwargs[i] = {k: v for k, v in kwargs.items() if k not in ("past_key_values", "past_key_value")}
            layer_kwargs[i]["use_cache"] = False
        return hook

    handles = [layer.register_forward_pre_hook(grab_kwargs(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        model(input_ids=batches[0][:1], use_cache=False)
    finally:
        for h in handles:
            h.remove()

    # 2. the inputs of layer 0 for every batch
    hidden: list[torch.Tensor] = []

    def catch(module, args, kwargs):
        hidden.append(args[0] if args else kwargs["hidden_states"])
        raise _Stop

    h = layers[0].register_forward_pre_hook(catch, with_kwargs=True)
    try:
        for batch in batches:
            try:
                model(input_ids=batch, use_cache=False)
            except _Stop:
                pass
    finally:
        h.remove()

    # 3. layer by layer
    for i, layer in enumerate(layers):
        captured: dict[str, list[torch.Tensor]] = {g: [] for g in groups}
        handles = []
        for g, names in groups.items():
            handles.append(layer.get_submodule(names[0]).register_forward_pre_hook(_capture_into(captured[g])))
        try:
            outs = []
            for x in hidden:
                out = layer(x, **layer_kwargs[i])
                outs.append(out[0] if isinstance(out, tuple) else out)
        finally:
            for h in handles:
                h.remove()
        inputs = {g: torch.cat([t.reshape(-1, t.shape[-1]).float() for t in ts]) for g, ts in captured.items()}
        yield i, layer, inputs
        del inputs, captured
        hidden = outs


def _capture_into(store: list) -> Callable:
    def hook(module, args):
        store.append(args[0].detach())
    return hook


def calibration_tokens(cfg: dict, tokenizer, data: str | None, heldout: int = 0):
    """(calibration [n, L], held-out [heldout, L] or None) token chunks per config quantize.calibration.

    Raises:
        ValueError: missing data file, or too little text for the requested chunks.
    """
    cal = cfg["quantize"]["calibration"]
    path = data or calibration_file(cfg)
    if not Path(path).is_file():
        raise ValueError(f"calibration data file {path!r} does not exist (config quantize.calibration.source = "
                         f"{cal['source']!r})")
    # the policy's own view of the data (chat template + <think>/<answer> completion) when the tokenizer has a template
    instruction = cfg["prompt"]["instruction"] if getattr(tokenizer, "chat_template", None) else None
    # tokenized once for both draws (the whole file: which chunks are drawn depends on its total length)
    ids = _concatenated_ids(read_texts(path, tokenizer=tokenizer, instruction=instruction), tokenizer)
    calib = _draw_chunks(ids, cal["n_sequences"], cal["seq_len"], cal["seed"], 0)
    held = None
    if heldout:
        held = _draw_chunks(ids, heldout, cal["seq_len"], cal["seed"], cal["n_sequences"])
    return calib, held
