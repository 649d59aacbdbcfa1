"""Adaptive Quantization Noise (AQN): Gaussian noise merged into the RMSNorm weights of the rollout policy.

Why: QeRL (sec. 3.3, Eq. 7-10, App. G) turns the static NVFP4 quantization noise into a schedulable exploration
signal. A noise vector Z ~ N(0, sigma^2 I) of shape (d,) is added to each decoder layer's RMSNorm scale,
w_noise = w + Z, which is the same as multiplying the rows of the following weights by (Z / w + 1): input_layernorm
feeds q/k/v (one shared vector), post_attention_layernorm feeds gate/up (another). No extra parameter and no change
to the 4-bit kernels. Alg. 1 line 9: the rollout policy is pi_old <- pi + N(0, sigma^2); the policy update and the
log-probs of the loss use the clean weights.

How:
    with applied(model, sigma, generator):           # noise on, resampled once (per rollout step)
        completions = rollout(model, prompts)
    # weights are restored bit for bit here, even if the rollout raised

    aqn = AdaptiveQuantizationNoise(NoiseSchedule(total_steps=600), seed=0)
    with applied(model, aqn.sigma(step), aqn.generator(step)):   # sigma from the schedule; step-seeded: resumable
        ...
A training run reaches this through one context manager, `qerl.policy.Policy.rollout_noise(step)`, around its
rollout (qerl/rl/step.py); nothing else applies AQN.
`resample="forward"` resamples Z on every forward pass of each norm (forward pre-hooks), i.e. per generated token
with a KV cache. The layers are found by module name (`...layers.<i>.input_layernorm` / `post_attention_layernorm`),
so plain transformers decoders (Qwen2, Llama, Mistral, ...) and peft-wrapped ones (`base_model.model.model.layers`)
both work. The final `model.norm` is not touched: it feeds lm_head, which the paper does not quantize.
Run the tests: `pytest tests/noise -q`.

Bit-exact removal: the original weights are cloned before the noise is added and copied back afterwards (w + Z - Z
is not w in floating point). The noise is drawn in float32 on the generator's device and cast to the weight's dtype
and device; sigma == 0 touches nothing, so weights and logits are identical.

Deviations (documented):
- Sec. 3.3 says Z "is resampled for each forward pass" while Alg. 1 draws it once per step; the default here is once
  per `applied` block (Alg. 1), with `resample="forward"` for the per-forward variant (whose hooks the rollout
  engine's fused RMSNorm would bypass, so such a rollout runs the eager sampler: `Policy.eager_rollout`).
- `AdaptiveQuantizationNoise` seeds each step's generator from (seed, step), so a resumed run draws the same noise;
  the paper does not specify seeding.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import nn

from qerl.noise.schedule import NoiseSchedule

__all__ = ["NORM_TARGETS", "find_norm_weights", "applied", "AdaptiveQuantizationNoise"]

NORM_TARGETS = ("input_layernorm", "post_attention_layernorm")
RESAMPLE_MODES = ("step", "forward")


def find_norm_weights(model: nn.Module, targets: Sequence[str] = NORM_TARGETS) -> list[tuple[str, nn.Module]]:
    """The RMSNorm modules that AQN perturbs: every module whose name ends in one of `targets` and that has a 1-D
    `weight` parameter, in `named_modules` order (layer 0 input, layer 0 post-attention, layer 1 input, ...).

    Args:
        model: a transformers decoder, bare or wrapped (peft, DDP-style `module.`), any nesting.
        targets: last components of the module names to perturb.

    Returns:
        [(qualified name, module)], each module once.

    Raises:
        ValueError: if no module matches (naming the model class and the targets).
    """
    found: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in targets:
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or id(weight) in seen:
            continue
        seen.add(id(weight))
        found.append((name, module))
    if not found:
        raise ValueError(
            f"AQN found no RMSNorm to perturb in {type(model).__name__}: no module named *.{' or *.'.join(targets)} "
            "with a 1-D weight"
        )
    return found


def _draw(d: int, sigma: float, generator: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    """Z ~ N(0, sigma^2) of shape (d,), drawn in float32 on the generator's device, moved to `like`'s device."""
    device = generator.device if generator is not None else torch.device("cpu")
    z = torch.randn(d, generator=generator, device=device, dtype=torch.float32)  # [d]
    return (z * sigma).to(like.device)  # [d]


@contextlib.contextmanager
def applied(
    model: nn.Module,
    sigma: float,
    generator: torch.Generator | None = None,
    resample: str = "step",
    targets: Sequence[str] = NORM_TARGETS,
) -> Iterator[list[str]]:
    """Add N(0, sigma^2) noise to the decoder RMSNorm weights inside the block; restore them exactly on exit.

    Args:
        model: the rollout policy (transformers decoder, optionally peft-wrapped).
        sigma: noise standard deviation (>= 0; 0 is a no-op).
        generator: torch.Generator for reproducible noise (None: torch's global RNG).
        resample: "step" draws one Z per norm for the whole block (Alg. 1); "forward" redraws it before every
            forward call of each norm (sec. 3.3), through forward pre-hooks.
        targets: module-name suffixes of the norms to perturb.

    Yields:
        The qualified names of the perturbed norms (empty when sigma == 0).

    Raises:
        ValueError: on a negative or non-finite sigma, an unknown resample mode, or a model without matching norms.
    """
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"AQN sigma must be a finite number >= 0, got {sigma!r}")
    if resample not in RESAMPLE_MODES:
        raise ValueError(f"AQN resample must be one of {RESAMPLE_MODES}, got {resample!r}")
    if sigma == 0:
        yield []
        return
    norms = find_norm_weights(model, targets)
    originals = [m.weight.detach().clone() for _, m in norms]
    handles = []
    try:
        with torch.no_grad():
            for (_, module), original in zip(norms, originals):
                noise = _draw(original.numel(), sigma, generator, original)  # [d]
                module.weight.copy_(original.float() + noise)  # w + Z, cast to the weight's dtype
        if resample == "forward":
            for (_, module), original in zip(norms, originals):
                handles.append(module.register_forward_pre_hook(_ResampleHook(original, sigma, generator)))
        yield [name for name, _ in norms]
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for (_, module), original in zip(norms, originals):
                module.weight.copy_(original)


class _ResampleHook:
    """Forward pre-hook: before each call of the norm, set its weight to original + fresh Z."""

    def __init__(self, original: torch.Tensor, sigma: float, generator: torch.Generator | None):
        self.original, self.sigma, self.generator = original, sigma, generator

    def __call__(self, module: nn.Module, args):
        with torch.no_grad():
            noise = _draw(self.original.numel(), self.sigma, self.generator, self.original)  # [d]
            module.weight.copy_(self.original.float() + noise)
        return None


@dataclass
class AdaptiveQuantizationNoise:
    """AQN for a training run: the schedule, the seed and the resampling mode in one object.

    Attributes:
        schedule: sigma as a function of the step (`NoiseSchedule`).
        seed: base seed; step t draws its noise from a generator seeded with (seed, t).
        resample: "step" or "forward" (see `applied`; "forward" needs the eager sampler).
        targets: module-name suffixes of the norms to perturb.
    """

    schedule: NoiseSchedule
    seed: int = 0
    resample: str = "step"
    targets: tuple[str, ...] = field(default=NORM_TARGETS)

    def __post_init__(self):
        if self.resample not in RESAMPLE_MODES:
            raise ValueError(f"AQN resample must be one of {RESAMPLE_MODES}, got {self.resample!r}")

    def sigma(self, step: int) -> float:
        """Sigma at a 0-based training step."""
        return self.schedule.sigma(step)

    def generator(self, step: int, device: str | torch.device = "cpu") -> torch.Generator:
        """A generator seeded from (seed, step), so step t draws the same noise in a resumed run."""
        return torch.Generator(device=device).manual_seed((self.seed * 1_000_003 + step) % (2**63))
