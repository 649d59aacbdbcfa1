"""Ablation variants of a method, by name (the `<variant>` part of a run's path), and the AQN schedule names.

A variant overrides a few run settings:
  default          the method as configured
  noaqn            AQN off (QeRL without AQN)
  aqn-<schedule>   AQN on with that schedule (one of AQN_SCHEDULES), on any method (on BF16 LoRA it separates
                   noise from quantization)
  rank<r>          LoRA rank r (alpha scaled with it, so alpha / r stays fixed)
  lr<value>        learning rate
  tis<C>           truncated importance sampling: each token's loss weighted by min(pi_old / pi_sampler, C)
  norms            the RMSNorm weights (input_layernorm, post_attention_layernorm) trained in full beside LoRA
The DAG and the report address runs by variant name; a variant whose overrides change nothing for a method under
the config (aqn-<the configured schedule> of an AQN method, noaqn of a method without AQN, rank<the configured
rank>, lr<the method's configured lr>) is the `default` run itself, so `canonical_variant` maps it there and the run
is trained once. No torch import: the Snakefile uses this at parse time.

AQN_SCHEDULES is the one list of schedule names: qerl.noise.schedule implements exactly these, the variant grammar
accepts exactly these, and tests/test_contract.py checks the config schema's enums against it.
"""
from __future__ import annotations

import re

from qerl.contract.methods import get_method, method_lr

__all__ = ["AQN_SCHEDULES", "VARIANT_FORMS", "parse_variant", "aqn_variant", "rank_variant", "lr_variant",
           "tis_variant", "canonical_variant"]

#: sigma decays of AQN (Eq. 8 is the exponential; Fig. 9 compares the others).
AQN_SCHEDULES = ("exponential", "linear", "cosine", "logarithmic")
VARIANT_FORMS = "default, noaqn, aqn-<schedule>, rank<r>, lr<value>, tis<C> or norms"
_VARIANT = re.compile(rf"^(default|noaqn|norms|aqn-({'|'.join(AQN_SCHEDULES)})|rank(\d+)|lr([0-9.eE+-]+)"
                      r"|tis([0-9.eE+-]+))$")


def parse_variant(variant: str) -> dict:
    """The settings a variant name overrides: {"aqn": False} for noaqn, {"aqn": True, "aqn_schedule": ...},
    {"lora_rank": r}, {"lr": x}, {"tis_cap": C}, {"train_norms": True}; {} for default.

    Raises:
        ValueError: naming the variant and the accepted forms.
    """
    m = _VARIANT.match(variant)
    if not m:
        raise ValueError(f"unknown variant {variant!r}; use {VARIANT_FORMS}")
    if variant == "noaqn":
        return {"aqn": False}
    if variant == "norms":
        return {"train_norms": True}
    if m.group(2):
        return {"aqn": True, "aqn_schedule": m.group(2)}
    if m.group(3):
        return {"lora_rank": int(m.group(3))}
    if m.group(4):
        try:
            return {"lr": float(m.group(4))}
        except ValueError:
            raise ValueError(f"variant {variant!r}: {m.group(4)!r} is not a number") from None
    if m.group(5):
        try:
            cap = float(m.group(5))
        except ValueError:
            raise ValueError(f"variant {variant!r}: {m.group(5)!r} is not a number") from None
        if not cap > 0:
            raise ValueError(f"variant {variant!r}: the TIS cap must be > 0")
        return {"tis_cap": cap}
    return {}


def aqn_variant(schedule: str) -> str:
    """Variant name of a run with AQN on under `schedule`: aqn_variant("linear") == "aqn-linear".

    Raises:
        ValueError: a schedule not in AQN_SCHEDULES.
    """
    if schedule not in AQN_SCHEDULES:
        raise ValueError(f"unknown AQN schedule {schedule!r}; known: {list(AQN_SCHEDULES)}")
    return f"aqn-{schedule}"


def rank_variant(rank: int) -> str:
    """Variant name of a LoRA-rank ablation run: rank_variant(64) == "rank64"."""
    return f"rank{int(rank)}"


def tis_variant(cap: float) -> str:
    """Variant name of a truncated-importance-sampling run: tis_variant(2) == "tis2"."""
    return f"tis{float(cap):g}"


def lr_variant(lr: float) -> str:
    """Variant name of a learning-rate ablation run: lr_variant(3e-5) == "lr3e-05" (parses back with float())."""
    return f"lr{float(lr):g}"


def canonical_variant(cfg: dict, method: str, variant: str) -> str:
    """`variant`, or "default" when it changes nothing for `method` under the (validated) config.

    Raises:
        ValueError: an unknown method or variant.
    """
    overrides = parse_variant(variant)
    tr = cfg["train"]
    same = {
        "aqn": get_method(method).aqn,
        "aqn_schedule": tr["aqn"]["schedule"],
        "lora_rank": tr["lora"]["rank"],
        "lr": method_lr(cfg, method),
    }
    if overrides and all(k in same and same[k] == v for k, v in overrides.items()):
        return "default"
    return variant
