"""The methods of the paper, in one registry used by training, evaluation and the tables.

| name        | weights | trainable | AQN          | paper row                  |
|-------------|---------|-----------|--------------|----------------------------|
| bf16 ...    | format  | none      | -            | Table 1/2 rows w/o training|
| full        | BF16    | all       | -            | "BF16 Full"                |
| lora        | BF16    | LoRA      | -            | "BF16 LoRA"                |
| qlora       | NF4     | LoRA      | -            | "NF4 LoRA"                 |
| mxfp4_lora  | MXFP4   | LoRA      | -            | "MXFP4 LoRA"               |
| nvfp4_lora  | NVFP4   | LoRA      | off          | "NVFP4 LoRA" (QeRL w/o AQN)|
| qerl        | NVFP4   | LoRA      | exponential  | "+AQN"                     |
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Method", "METHODS", "TRAINED_METHODS", "UNTRAINED_METHODS", "get_method"]


@dataclass(frozen=True)
class Method:
    name: str
    weights: str  # "bf16" | "nf4" | "mxfp4" | "nvfp4"
    trainable: str  # "none" | "all" | "lora"
    aqn: bool
    label: str  # the paper's row label


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("bf16", "bf16", "none", False, "BF16"),
        Method("nf4", "nf4", "none", False, "NF4"),
        Method("mxfp4", "mxfp4", "none", False, "MXFP4"),
        Method("nvfp4", "nvfp4", "none", False, "NVFP4"),
        Method("full", "bf16", "all", False, "BF16 Full"),
        Method("lora", "bf16", "lora", False, "BF16 LoRA"),
        Method("qlora", "nf4", "lora", False, "NF4 LoRA (QLoRA)"),
        Method("mxfp4_lora", "mxfp4", "lora", False, "MXFP4 LoRA"),
        Method("nvfp4_lora", "nvfp4", "lora", False, "NVFP4 LoRA (QeRL w/o AQN)"),
        Method("qerl", "nvfp4", "lora", True, "NVFP4 LoRA + AQN (QeRL)"),
    ]
}
TRAINED_METHODS = [n for n, m in METHODS.items() if m.trainable != "none"]
UNTRAINED_METHODS = [n for n, m in METHODS.items() if m.trainable == "none"]


def get_method(name: str) -> Method:
    """The registry entry for `name`. Raises ValueError naming the known methods."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known methods: {sorted(METHODS)}") from None
