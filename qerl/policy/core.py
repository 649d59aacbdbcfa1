"""`build_policy`: the one place that turns a method name into a model -- base weights, their format, adapters, AQN.

Why one builder: the trainer, the evaluator, the quantization stage and both profilers need the same model for the
same method; when each loaded and converted it itself, "NVFP4 + LoRA" could mean different things in different
tables. Every row of every table is now built here, in this order:
  1. the base: a checkpoint folder (transformers, in `dtype`), a GGUF file (transformers' dequantizing loader), or a
     model already in memory (the profilers' random-weight architectures);
  2. its weights in the method's format (qerl.contract.methods: bf16 / nvfp4 / mxfp4 / nf4): a quantized checkpoint
     of the quantization stage when `quantized` is given (AWQ-calibrated NVFP4/MXFP4, or the NF4 recipe), else
     round-to-nearest at load time through `quantize_model` (one `quantize_`-shaped entry for all three 4-bit
     formats); a model already in the format is taken as it is;
  3. what is trained: every weight (`full`), new LoRA adapters (`lora=LoraSpec(...)`: peft, with QuantLinear
     registered; `train_norms` also trains the RMSNorm weights as peft modules_to_save), a trained adapter for
     evaluation (`adapter=DIR`), or nothing;
  4. AQN (`aqn=AqnSpec(...)`): the noise object whose `Policy.rollout_noise(step)` perturbs the RMSNorm weights
     during a rollout and restores them after.

    policy = build_policy("qerl", "results/tiny/models/tiny/base", quantized="results/tiny/quantized/tiny/nvfp4",
                          lora=LoraSpec(rank=16, alpha=32), aqn=AqnSpec(NoiseSchedule(16, 8, 1e-2, 5e-4)))
    policy = build_policy("nvfp4", base_dir, adapter="results/tiny/runs/.../adapter")   # evaluation
    policy.model, policy.tokenizer, policy.info                                          # info: what was loaded

Run the tests: `pytest tests/policy -q`.
"""
from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from qerl.contract.methods import Method, get_method
from qerl.policy.formats import checkpoint_format, keep_trainable_layout, quantize_model, torch_dtype, weight_nbytes

__all__ = ["NF4_DECODES", "LoraSpec", "AqnSpec", "Policy", "build_policy", "load_tokenizer", "load_base",
           "load_adapter", "set_gradient_checkpointing"]

#: config model.nf4_decode: how the decode engine runs NF4 layers (build_policy)
NF4_DECODES = ("bitsandbytes", "dequantized")
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


@dataclass(frozen=True)
class LoraSpec:
    """New, trainable LoRA adapters.

    Attributes:
        rank, alpha, dropout: peft's r, lora_alpha, lora_dropout (scale alpha / rank).
        targets: the projections that get adapters.
        train_norms: also train the decoder RMSNorm weights in full (peft modules_to_save, the official ln=True).
    """

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = _LINEARS
    train_norms: bool = False


@dataclass(frozen=True)
class AqnSpec:
    """Adaptive Quantization Noise of a run: its sigma schedule, the seed of its draws, and when it is redrawn."""

    schedule: Any  # qerl.noise.NoiseSchedule
    seed: int = 0
    resample: str = "step"


@dataclass
class Policy:
    """A model built for one method, and what goes with it.

    Attributes:
        model: the transformers model (a peft.PeftModel with adapters).
        tokenizer: its tokenizer (None only when a model was given without one).
        method: the registry entry.
        info: what was loaded (base, format, quantization, adapter, dtype, device, bytes), for results files.
        aqn: the run's AQN (qerl.noise.AdaptiveQuantizationNoise) or None.
        sample_dtype: the dtype rollouts and evaluations sample in when it differs from the model's (full
            fine-tuning keeps float32 master weights under a 16-bit config: `sampling_model`); None: the model's own.
    """

    model: nn.Module
    tokenizer: Any
    method: Method
    info: dict = field(default_factory=dict)
    aqn: Any = None
    sample_dtype: torch.dtype | None = None
    _sampler: nn.Module | None = field(default=None, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimizer updates, in module order."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def rollout_noise(self, step: int, device: str | torch.device | None = None) -> Iterator[float]:
        """`with policy.rollout_noise(step) as sigma:` the one way AQN reaches the rollout: this step's noise on the
        RMSNorm weights (qerl.noise.aqn.applied, sigma from the schedule, drawn from a (seed, step) generator on
        `device`, default the model's), restored bit for bit on exit. Yields the sigma in force (0.0 without AQN or
        in stage 0).

        Raises:
            ValueError: as qerl.noise.aqn.applied and NoiseSchedule.sigma.
        """
        from qerl.noise.aqn import applied

        if self.aqn is None:
            yield 0.0
            return
        sigma = self.aqn.sigma(step)
        generator = self.aqn.generator(step, device if device is not None else self.device)
        with applied(self.model, sigma, generator, self.aqn.resample, self.aqn.targets):
            yield sigma

    @torch.no_grad()
    def sampling_model(self) -> nn.Module:
        """The model rollouts and evaluations sample from: `model` itself, or, with `sample_dtype` set (full
        fine-tuning's float32 master weights under a bfloat16 config), one copy of it in that dtype, refreshed in
        place from the current weights at every call (call it after the optimizer step and inside rollout_noise).

        Why: sampling in float32 ran the decode engine without its 16-bit kernels and on float32 GEMMs: in the
        small DAG on an H100 (run 12, 8 jobs sharing the GPU) full fine-tuning's rollouts took 13.7-16.5 s a step
        against BF16 LoRA's 5.2-5.4 s (613-842 vs 1706-1879 tokens/s) and its GSM8K evaluation 113-136 s against
        50-57 s, which made it the DAG's critical path. Every other method samples in the config's dtype, as RL
        frameworks sample from a 16-bit copy of the trained weights. The copy costs one 16-bit set of weights; its
        buffers (rotary frequencies) stay as they are, the same object is returned each time (the decode engine and
        its CUDA graphs stay valid), and tied weights stay tied. AQN redrawn on every forward pass works through
        hooks on the model's own norms (eager_rollout): such a policy samples from the model itself.
        """
        if self.sample_dtype is None or self.eager_rollout or \
                next(self.model.parameters()).dtype == self.sample_dtype:
            return self.model
        params = list(self.model.parameters())
        if self._sampler is None:
            memo = {id(p): nn.Parameter(p.detach().to(self.sample_dtype), requires_grad=False) for p in params}
            self._sampler = copy.deepcopy(self.model, memo).eval()
        else:
            for mine, p in zip(self._sampler.parameters(), params):
                mine.copy_(p)
        return self._sampler

    @property
    def eager_rollout(self) -> bool:
        """True when the rollout must run the eager sampler (qerl.rl.rollout.sample(engine=False)): AQN resampled on
        every forward pass works through forward pre-hooks on the norms, which the engine's fused RMSNorm bypasses."""
        return self.aqn is not None and self.aqn.resample == "forward"


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


def _check_folder(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise ValueError(f"--base {str(path)!r}: not a checkpoint folder (no config.json there)")


def load_base(base: str | Path, dtype: str | torch.dtype = "float32", device: str | torch.device | None = None):
    """A transformers causal LM and its tokenizer from a checkpoint folder or a GGUF file (no network).

    Args:
        base: a folder with config.json, weights and tokenizer files, or a .gguf file (dequantized by transformers).
        dtype: "float32", "bfloat16", "float16" or a torch dtype.
        device: where to put the model (None: where it was loaded, the CPU).

    Returns:
        (model in eval mode, tokenizer with a pad token).

    Raises:
        ValueError: a folder without config.json, a missing GGUF file, or an unknown dtype.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, dt = Path(base), torch_dtype(dtype)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"GGUF file {str(path)!r} does not exist")
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dt)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        _check_folder(path)
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, local_files_only=True)
    if device is not None:
        model.to(device)
    return model.eval(), tokenizer


def load_adapter(model: nn.Module, adapter_dir: str | Path):
    """Wrap `model` in its trained peft LoRA adapter (QuantLinear layers registered), inference mode.

    Args:
        model: the base model, already in its weight format.
        adapter_dir: folder with adapter_config.json and adapter weights (peft's save_pretrained).

    Returns:
        The peft.PeftModel, in eval mode.

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


def set_gradient_checkpointing(model: nn.Module, on: bool) -> None:
    """Recompute activations in the backward pass (on) or keep them (off); non-reentrant, inputs require grad."""
    # transformers >= 5.24 names these activation_checkpointing_*, earlier 5.x (the GPU image's 5.17) gradient_*
    new_api = hasattr(model, "activation_checkpointing_enable")
    if on:
        if new_api:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    elif new_api:
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def _add_lora(model: nn.Module, lora: LoraSpec):
    import peft

    from qerl.layers.lora import register_quant_linear
    from qerl.noise.aqn import NORM_TARGETS

    for p in model.parameters():
        p.requires_grad_(False)
    config = register_quant_linear(peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                   target_modules=list(lora.targets),
                                                   modules_to_save=list(NORM_TARGETS) if lora.train_norms else None,
                                                   bias="none", task_type="CAUSAL_LM"))
    return peft.get_peft_model(model, config)


def build_policy(method: str, base: str | Path | nn.Module, *, quantized: str | Path | None = None,
                 lora: LoraSpec | None = None, adapter: str | Path | None = None, aqn: AqnSpec | None = None,
                 tokenizer=None, device: str | torch.device | None = None, dtype: str | torch.dtype = "float32",
                 targets: tuple[str, ...] | None = None, gradient_checkpointing: bool = False,
                 nf4_decode: str = "bitsandbytes") -> Policy:
    """Build the model of `method` (the module docstring gives the steps).

    Args:
        method: a name of qerl.contract.methods (a trained method, or an untrained format bf16/nf4/mxfp4/nvfp4).
        base: the base checkpoint folder, a .gguf file, or a model (already in the method's format, or BF16).
        quantized: a folder of the quantization stage holding the method's 4-bit weights (replaces the base's).
        lora: new trainable LoRA adapters (methods that train LoRA).
        adapter: a trained adapter folder to evaluate (inference mode).
        aqn: the run's Adaptive Quantization Noise.
        tokenizer: the tokenizer of a model given as `base` (a folder's own tokenizer is always used).
        device: where the model runs (None: the CPU, or where a given model is).
        dtype: dtype of the unquantized weights and of activations.
        targets: layers a round-to-nearest conversion quantizes (default q/k/v/o/gate/up/down).
        gradient_checkpointing: recompute activations in the backward pass.
        nf4_decode: config model.nf4_decode: "bitsandbytes" (the decode engine calls NF4 layers as they are) or
            "dequantized" (it runs them from a copy of their dequantized weights: baselines.nf4.mark_decode_dequantized).

    Returns:
        The Policy (model, tokenizer, method, info, aqn).

    Raises:
        ValueError: unknown method, dtype or nf4_decode, a bad folder, a quantized checkpoint of another format (or for a BF16
            method), a given model in another 4-bit format, LoRA for a method that does not train LoRA, both
            `lora` and `adapter`, or an adapter on a fully fine-tuned method.
        RuntimeError: NF4 where bitsandbytes cannot run.
    """
    meth = get_method(method)
    fmt, dt = meth.weights, torch_dtype(dtype)
    if nf4_decode not in NF4_DECODES:
        raise ValueError(f"nf4_decode (config model.nf4_decode) must be one of {', '.join(NF4_DECODES)}, got "
                         f"{nf4_decode!r}")
    if lora is not None and meth.trainable != "lora":
        raise ValueError(f"method {method!r} does not train LoRA adapters (trainable: {meth.trainable})")
    if lora is not None and adapter is not None:
        raise ValueError("give new LoRA adapters (lora=) or a trained adapter (adapter=), not both")
    if adapter is not None and meth.trainable == "all":
        raise ValueError(f"method {method!r} trains every weight: it has no adapter to load")
    if isinstance(base, nn.Module):
        model, found = base, checkpoint_format(base)
        if found not in ("bf16", fmt):
            raise ValueError(f"the given model holds {found} weights, but method {method!r} needs {fmt}")
        how = f"{fmt} (given model)"
        if found != fmt:  # a BF16 model: round-to-nearest now
            quantize_model(model, fmt, targets, compute_dtype=dt)
            how = f"{fmt} round-to-nearest at load time (no AWQ scaling)"
        if device is not None:
            model.to(device)
    elif quantized is not None:
        if fmt == "bf16":
            raise ValueError(f"--quantized {str(quantized)!r}: method {method!r} has BF16 weights; a quantized "
                             "checkpoint is for the nf4 / mxfp4 / nvfp4 methods")
        from qerl.policy.checkpoint import load_quantized

        _check_folder(Path(base))
        tokenizer = load_tokenizer(base)
        model = load_quantized(quantized, dt, device if device is not None else "cpu")
        found = checkpoint_format(model)
        if found != fmt:
            raise ValueError(f"--quantized {str(quantized)!r} holds {found} weights, but method {method!r} needs {fmt}")
        how = f"{fmt} checkpoint {quantized}"
    else:
        model, tokenizer = load_base(base, dt, device)
        quantize_model(model, fmt, targets, compute_dtype=dt)
        model.eval()
        how = {"bf16": "none", "nf4": "bitsandbytes NF4 (blocksize 64, double quant)"}.get(
            fmt, f"{fmt} round-to-nearest at load time (no AWQ scaling)")
    if fmt == "nf4":
        keep_trainable_layout(model)
        if nf4_decode == "dequantized":
            from baselines.nf4 import mark_decode_dequantized

            mark_decode_dequantized(model)
    if meth.trainable == "all":
        for p in model.parameters():
            p.requires_grad_(True)
    elif lora is not None:
        model = _add_lora(model, lora)
    elif adapter is not None:
        model = load_adapter(model, adapter)
    if gradient_checkpointing:
        set_gradient_checkpointing(model, True)
    noise = None
    if aqn is not None:
        from qerl.noise import AdaptiveQuantizationNoise

        noise = AdaptiveQuantizationNoise(aqn.schedule, seed=aqn.seed, resample=aqn.resample)
    info = {"model_dir": None if isinstance(base, nn.Module) else str(base), "format": fmt, "quantization": how,
            "quantized_dir": None if quantized is None else str(quantized),
            "adapter": None if adapter is None else str(adapter), "dtype": str(dt).removeprefix("torch."),
            "device": str(device if device is not None else next(model.parameters()).device),
            "nbytes": int(weight_nbytes(model))}
    return Policy(model, tokenizer, meth, info, noise)
