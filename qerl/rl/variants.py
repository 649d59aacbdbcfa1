"""Ablation variants of a method, by name: default, noaqn, aqn-<schedule>, rank<r>, lr<value>.

A variant overrides a few run settings. The DAG and the report address runs by variant name; a variant whose
overrides change nothing for a method under the config (aqn-<the configured schedule>, rank<the configured rank>,
lr<the method's configured lr>) is the `default` run itself, so `canonical_variant` maps it there and the run is
trained once. No torch import: the Snakefile uses this at parse time.
"""
from __future__ import annotations

import re

__all__ = ["VARIANT_FORMS", "parse_variant", "lr_variant", "canonical_variant"]

VARIANT_FORMS = "default, noaqn, aqn-<schedule>, rank<r> or lr<value>"
_VARIANT = re.compile(r"^(default|noaqn|aqn-(exponential|linear|cosine|logarithmic)|rank(\d+)|lr([0-9.eE+-]+))$")


def parse_variant(variant: str) -> dict:
    """The settings a variant name overrides: {"aqn": False} for noaqn, {"aqn_schedule": ...}, {"lora_rank": r},
    {"lr": x}; {} for default.

    Raises:
        ValueError: naming the variant and the accepted forms.
    """
    m = _VARIANT.match(variant)
    if not m:
        raise ValueError(f"unknown variant {variant!r}; use {VARIANT_FORMS}")
    if variant == "noaqn":
        return {"aqn": False}
    if m.group(2):
        return {"aqn_schedule": m.group(2)}
    if m.group(3):
        return {"lora_rank": int(m.group(3))}
    if m.group(4):
        try:
            return {"lr": float(m.group(4))}
        except ValueError:
            raise ValueError(f"variant {variant!r}: {m.group(4)!r} is not a number") from None
    return {}


def lr_variant(lr: float) -> str:
    """Variant name of a learning-rate ablation run: lr_variant(3e-5) == "lr3e-05"."""
    return f"lr{float(lr):g}"


def canonical_variant(cfg: dict, method: str, variant: str) -> str:
    """`variant`, or "default" when it changes nothing for `method` under the (validated) config."""
    overrides = parse_variant(variant)
    tr = cfg["train"]
    same = {
        "aqn_schedule": tr["aqn"]["schedule"],
        "lora_rank": tr["lora"]["rank"],
        "lr": tr["lr_by_method"].get(method, tr["lr"]),
    }
    if overrides and all(k in same and same[k] == v for k, v in overrides.items()):
        return "default"
    return variant
