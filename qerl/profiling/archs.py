"""The Qwen2.5-Instruct architectures the paper profiles, as transformers configs (no weights, nothing downloaded).

Why: speed and memory depend on the shapes, not on the weights' values, so the profiling builds these
architectures with random weights (qerl.profiling.build). Shapes are those of the published model configs
(hidden size, MLP width, layers, attention heads, KV heads, vocabulary, tied embeddings); every Qwen2.5 model has
biases on q/k/v and none elsewhere, RMSNorm eps 1e-6 and RoPE theta 1e6.

    cfg = qwen25_config("7B")          # a transformers Qwen2Config
    ARCHS["32B"].params                # parameter count (32.76e9 for 32B, 7.62e9 for 7B)
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Arch", "ARCHS", "qwen25_config", "arch_names"]


@dataclass(frozen=True)
class Arch:
    name: str  # "7B"
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def model_name(self) -> str:
        return f"Qwen2.5-{self.name}-Instruct"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def linear_params(self) -> int:
        """Weights of q/k/v/o/gate/up/down over all layers (what the 4-bit formats quantize)."""
        kv = self.kv_heads * self.head_dim
        per_layer = self.hidden * (self.hidden + 2 * kv) + self.hidden * self.hidden + 3 * self.hidden * self.intermediate
        return per_layer * self.layers

    @property
    def params(self) -> int:
        """All parameters: linear weights, q/k/v biases, norms, embeddings (and lm_head unless tied)."""
        kv = self.kv_heads * self.head_dim
        rest = self.layers * (self.hidden + 2 * kv + 2 * self.hidden) + self.hidden
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.linear_params + rest + emb


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in [
        Arch("0.5B", 896, 4864, 24, 14, 2, 151936, True),
        Arch("1.5B", 1536, 8960, 28, 12, 2, 151936, True),
        Arch("3B", 2048, 11008, 36, 16, 2, 151936, True),
        Arch("7B", 3584, 18944, 28, 28, 4, 152064, False),
        Arch("14B", 5120, 13824, 48, 40, 8, 152064, False),
        Arch("32B", 5120, 27648, 64, 40, 8, 152064, False),
        Arch("72B", 8192, 29568, 80, 64, 8, 152064, False),
    ]
}


def arch_names() -> list[str]:
    return list(ARCHS)


def qwen25_config(name: str, *, layers: int | None = None, max_positions: int = 32768):
    """A transformers Qwen2Config with the shapes of Qwen2.5-`name`-Instruct.

    Args:
        name: one of ARCHS ("3B", "7B", "14B", "32B", "72B", ...).
        layers: override the layer count (tests build 1-2 layer models of the real widths).
        max_positions: max_position_embeddings.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    from transformers import Qwen2Config

    if name not in ARCHS:
        raise ValueError(f"unknown architecture {name!r}; known: {arch_names()}")
    a = ARCHS[name]
    return Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                       num_hidden_layers=layers or a.layers, num_attention_heads=a.heads,
                       num_key_value_heads=a.kv_heads, max_position_embeddings=max_positions,
                       rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=a.tied, use_sliding_window=False,
                       hidden_act="silu", bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
