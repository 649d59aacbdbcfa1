"""The methods of the paper, in one registry: what each trains, in which weight format, with or without AQN, and
every label a table, figure or claim prints for it.

| name        | weights | trainable | AQN          | label (figures, claims)        | short | W#    |
|-------------|---------|-----------|--------------|--------------------------------|-------|-------|
| bf16 ...    | format  | none      | -            | BF16 / NF4 / MXFP4 / NVFP4     | name  | format|
| full        | BF16    | all       | -            | BF16 Full                      | Full  | BF16  |
| lora        | BF16    | LoRA      | -            | BF16 LoRA                      | LoRA  | BF16  |
| qlora       | NF4     | LoRA      | -            | NF4 LoRA (QLoRA)               | QLoRA | NF4   |
| mxfp4_lora  | MXFP4   | LoRA      | -            | MXFP4 LoRA                     | name  | MXFP4 |
| nvfp4_lora  | NVFP4   | LoRA      | off          | NVFP4 LoRA (QeRL w/o AQN)      | name  | NVFP4 |
| qerl        | NVFP4   | LoRA      | exponential  | NVFP4 LoRA + AQN (QeRL)        | QeRL  | NVFP4 |

Why here: training (which weights, what is trainable, AQN by default), evaluation (the untrained formats), the
Snakemake rules (which methods read which quantized checkpoint) and the report (row labels) all read these rows,
so a method is added in one place. No torch import: the Snakefile reads this at parse time.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Method", "METHODS", "TRAINED_METHODS", "UNTRAINED_METHODS", "WEIGHT_FORMATS", "SPEED_METHODS",
           "LEARNING_METHODS", "get_method", "method_lr"]

#: the weight formats a method's frozen base can be in (the untrained rows of Tables 1/2 are these formats).
WEIGHT_FORMATS = ("bf16", "nf4", "mxfp4", "nvfp4")


@dataclass(frozen=True)
class Method:
    """One row of the registry.

    Attributes:
        name: the method's name in configs, paths and CLI flags.
        weights: the base weights' format, one of WEIGHT_FORMATS.
        trainable: "none" (evaluation only), "all" (full fine-tuning) or "lora".
        aqn: Adaptive Quantization Noise on by default (a variant can switch it either way).
        label: the paper's row label, as figure legends and the claims' tables print it.
        short: the method column of the efficiency tables (Tables 3, 5-8) and the claims' memory lines.
        wbits: the W# column (the weight format as the paper's tables print it).
        prose: the label inside the claims' running text and tables where it differs from `label`.
        speed: the legend label of the speed figures (batch sweep), for the SPEED_METHODS.
        color: the method's matplotlib colour in the speed figures, for the SPEED_METHODS.
    """

    name: str
    weights: str
    trainable: str
    aqn: bool
    label: str
    short: str = ""
    wbits: str = ""
    prose: str = ""
    speed: str = ""
    color: str = ""

    def __post_init__(self):
        # defaults that depend on other fields (a frozen dataclass sets them through object.__setattr__)
        object.__setattr__(self, "short", self.short or self.name)
        object.__setattr__(self, "wbits", self.wbits or self.weights.upper())
        object.__setattr__(self, "prose", self.prose or self.label)


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("bf16", "bf16", "none", False, "BF16"),
        Method("nf4", "nf4", "none", False, "NF4"),
        Method("mxfp4", "mxfp4", "none", False, "MXFP4"),
        Method("nvfp4", "nvfp4", "none", False, "NVFP4"),
        Method("full", "bf16", "all", False, "BF16 Full", short="Full", prose="BF16 full"),
        Method("lora", "bf16", "lora", False, "BF16 LoRA", short="LoRA", speed="BF16 LoRA", color="tab:gray"),
        Method("qlora", "nf4", "lora", False, "NF4 LoRA (QLoRA)", short="QLoRA", speed="QLoRA (NF4)",
               color="tab:orange"),
        Method("mxfp4_lora", "mxfp4", "lora", False, "MXFP4 LoRA"),
        Method("nvfp4_lora", "nvfp4", "lora", False, "NVFP4 LoRA (QeRL w/o AQN)"),
        Method("qerl", "nvfp4", "lora", True, "NVFP4 LoRA + AQN (QeRL)", short="QeRL", speed="QeRL (NVFP4)",
               color="tab:green"),
    ]
}
TRAINED_METHODS = [n for n, m in METHODS.items() if m.trainable != "none"]
UNTRAINED_METHODS = [n for n, m in METHODS.items() if m.trainable == "none"]
#: the methods the paper's efficiency results compare (Tables 3, 5-9, Figs. 1 and 11, the batch sweep, `qerl profile`)
SPEED_METHODS = ("lora", "qlora", "qerl")
#: BF16 LoRA and NVFP4 LoRA without and with AQN: the learning comparisons (Fig. 4's curves, the claims' rates)
LEARNING_METHODS = ("lora", "nvfp4_lora", "qerl")


def get_method(name: str) -> Method:
    """The registry entry for `name`.

    Raises:
        ValueError: naming the known methods.
    """
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known methods: {sorted(METHODS)}") from None


def method_lr(cfg: dict, method: str) -> float:
    """The learning rate a method trains with under the (validated) config: train.lr_by_method, else train.lr."""
    tr = cfg["train"]
    return tr["lr_by_method"].get(method, tr["lr"])
