"""A static-shape decoder for rollouts: preallocated KV cache, our own attention, CUDA graphs per cache-length bucket.

Why: transformers' generate with a dynamic cache spends most of a decode step in Python and launch overhead
(47.7 tok/s for a 7B model at batch 1 on an H200, where the weights alone allow several hundred). This engine runs
the model's own modules (embeddings, RMSNorms, q/k/v/o/gate/up/down whatever they are: nn.Linear, QuantLinear,
bitsandbytes Linear4bit, peft LoRA wrappers around any of them; the LM head) in a fixed-shape step that is
captured once as a CUDA graph and replayed. Nothing is copied: the graph reads the modules' tensors, so LoRA
weights updated in place by the optimizer and RMSNorm weights carrying AQN noise (written in place by qerl.noise)
are seen by the next replay.

Layout and numerics (Qwen2 / Llama family: RMSNorm, RoPE, GQA, SiLU MLP):
  * KV cache [layers, B, kv_heads, max_len, head_dim]; slot j of a row holds its j-th column (left-padded prompt,
    then the completion); `valid[b, j]` marks real tokens; a query at slot i attends to valid slots <= i (and always
    to itself, so padding stays finite).
  * Decode step t attends to the first S slots, S the smallest bucket (multiple of `bucket`) covering P + t + 1:
    one graph per bucket, so attention reads what is filled, not the whole cache.
  * GQA without repeating K/V: queries are viewed [B, kv_heads, group * T, head_dim] against K [B, kv_heads, S, d].
  * NVFP4/MXFP4 q/k/v and gate/up run as one grouped kernel launch each (kernels.concat_prepared); the members'
    prepared buffers become views of the group (no extra memory). LoRA deltas are added by the adapters' own
    modules. Scores are in the compute dtype, softmax in float32.
  * Sampling in the graph: temperature, top-p, Gumbel-max with the default CUDA generator (seed it with
    torch.manual_seed); per-token entropy and log-prob of the sampling distribution, as qerl.rl.rollout.sample.
On CPU (tests) the same step runs eagerly; `graphs=False` forces eager on CUDA too.

    eng = DecodeEngine(model, batch=8, max_len=256 + 2048)
    out = eng.generate(prompt_ids, attention_mask, max_new_tokens=2048, temperature=1.0, eos_ids=[151645],
                       force_length=True)          # out.tokens [8, 2048], out.logp, out.entropy, out.lengths
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["DecodeEngine", "EngineOutput", "supports"]


@dataclass
class EngineOutput:
    tokens: torch.Tensor  # [B, L] sampled tokens (pad after a row's end)
    logp: torch.Tensor  # [B, L] float32 log-prob of each token under its sampling distribution
    entropy: torch.Tensor  # [B, L] float32 entropy (nats) of that distribution
    lengths: torch.Tensor  # [B] tokens up to and including the stop (EOS), or L
    finished: torch.Tensor  # [B] True where an EOS ended the row


def _unwrap(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base


def supports(model) -> bool:
    """True if `model` has the Qwen2/Llama layout this engine runs (model.model.layers with self_attn/mlp)."""
    base = _unwrap(model)
    layers = getattr(getattr(base, "model", None), "layers", None)
    if not layers or not hasattr(base, "lm_head"):
        return False
    layer = layers[0]
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and \
        all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")) and \
        getattr(base.config, "model_type", "") in ("qwen2", "llama", "mistral")


def _lora_parts(mod):
    """(base layer, [(A, B, scale), ...] of the active adapters) of a peft LoRA layer, or (mod, []) for others."""
    if not (hasattr(mod, "base_layer") and hasattr(mod, "lora_A")):
        return mod, []
    if getattr(mod, "merged", False):
        return mod, None  # merged weights: call the layer as it is
    if getattr(mod, "disable_adapters", False):
        return mod.base_layer, []
    parts = []
    for name in mod.active_adapters:
        if name in mod.lora_A:
            parts.append((mod.lora_A[name], mod.lora_B[name], mod.scaling[name]))
    return mod.base_layer, parts


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    """RMSNorm with the module's weight (read at call time: AQN noise written into it is seen)."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)


class _Proj:
    """Linear layers reading one input (q/k/v, gate/up, or a single o/down) as one base GEMM plus one low-rank
    update for all their LoRA adapters: y = x W_cat^T + b_cat + (x A_cat^T) B_cat^T, split into the members'
    outputs. A_cat stacks the adapters' A; B_cat is block-diagonal with each adapter's scaled B (refresh() copies
    the current adapter weights in, so an optimizer step between generations is seen). Base weights are grouped
    when frozen: NVFP4/MXFP4 QuantLinear through kernels.concat_prepared (members' buffers become views of the
    group), nn.Linear by concatenation (members' weights become views); anything else (bitsandbytes NF4) runs
    member by member. Merged or multi-adapter or DoRA layers are simply called.

    __call__(x) -> (y or None, [outputs]): y is the concatenated output when one tensor holds all members."""

    def __init__(self, mods, fuse: bool, dtype: torch.dtype):
        from torch import nn

        from qerl.layers import QuantLinear

        self.mods = list(mods)
        parts = [_lora_parts(m) for m in self.mods]
        self.kind, self.lora = "call", None
        dora = any(any(getattr(m, "use_dora", {}).get(n, False) for n in getattr(m, "active_adapters", []))
                   for m in self.mods)
        if not fuse or dora or any(p[1] is None or len(p[1]) > 1 for p in parts):
            return
        bases = [p[0] for p in parts]
        self.bases = bases
        self.sizes = [int(b.out_features) for b in bases]
        k = {getattr(b, "in_features", None) for b in bases}
        frozen = all(not p.requires_grad for b in bases for p in b.parameters())
        if len(k) != 1 or not frozen:
            return
        w0 = next(iter(bases[0].buffers()), None) if isinstance(bases[0], QuantLinear) else None
        if all(isinstance(b, QuantLinear) for b in bases) and len({b.fmt for b in bases}) == 1 and \
                w0 is not None and w0.is_cuda:
            self._group_fp4(bases)
        elif all(type(b) is nn.Linear for b in bases):
            self._group_dense(bases)
        else:
            self.kind = "bases"
        loras = [p[1][0] if p[1] else None for p in parts]
        if any(x is not None for x in loras):
            ref = next(x for x in loras if x is not None)[0].weight
            rank_total = sum(x[0].weight.shape[0] for x in loras if x is not None)
            kin = ref.shape[1]
            self.a_cat = torch.zeros(rank_total, kin, dtype=dtype, device=ref.device)
            self.b_cat = torch.zeros(sum(self.sizes), rank_total, dtype=dtype, device=ref.device)
            self.lora, r0, n0 = [], 0, 0
            for x, n in zip(loras, self.sizes):
                if x is not None:
                    a, b, s = x
                    r = a.weight.shape[0]
                    self.lora.append((a.weight, b.weight, float(s), r0, r, n0, n))
                    r0 += r
                n0 += n
            self.refresh()

    def _group_fp4(self, bases) -> None:
        from kernels.prepared_ops import group_bias

        for b in bases:
            b.prepare_kernels()
        if len(bases) == 1:
            self.group, self.bias = bases[0].prepared(), bases[0].bias
        else:
            import kernels
            group = kernels.concat_prepared([b.prepared() for b in bases])
            for b, (row, _) in zip(bases, group.parts):  # members become views of the group: no second copy
                rows = b._buffers["w4_words"].shape[0]
                b._buffers["w4_words"] = group.words[row:row + rows]
                b._buffers["w4_scales"] = group.scales[row:row + rows]
                b._buffers["w4_out_scales_bits"] = group.out_scales[:, row:row + rows].view(torch.int32)
            self.group, self.bias = group, group_bias(group, [b.bias for b in bases])
        self.kind = "fp4"

    def _group_dense(self, bases) -> None:
        if len(bases) == 1:
            self.w, self.bias = bases[0].weight, bases[0].bias
        else:
            with torch.no_grad():
                self.w = torch.cat([b.weight for b in bases])
                row = 0
                for b in bases:  # members become views of the concatenation: no second copy
                    n = b.weight.shape[0]
                    b.weight.data = self.w[row:row + n]
                    row += n
                biases = [b.bias for b in bases]
                self.bias = None if all(x is None for x in biases) else torch.cat(
                    [x if x is not None else self.w.new_zeros(n) for x, n in zip(biases, self.sizes)])
        self.kind = "dense"

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the adapters' current weights (B scaled) into A_cat / B_cat."""
        if self.lora is None:
            return
        for a, b, s, r0, r, n0, n in self.lora:
            self.a_cat[r0:r0 + r].copy_(a)
            self.b_cat[n0:n0 + n, r0:r0 + r].copy_(b * s)

    def __call__(self, x: torch.Tensor):
        if self.kind == "call":
            return None, [m(x) for m in self.mods]
        if self.kind == "bases":
            outs = [b(x) for b in self.bases]
            if self.lora is not None:
                t = F.linear(x, self.a_cat)
                outs = [o + F.linear(t, self.b_cat[n0:n0 + n]) for o, n0, n in zip(
                    outs, [sum(self.sizes[:i]) for i in range(len(self.sizes))], self.sizes)]
            return None, outs
        if self.kind == "fp4":
            from kernels.prepared_ops import fp4_prepared_linear
            y = fp4_prepared_linear(x, self.group, self.bias)
        else:
            y = F.linear(x, self.w, self.bias)
        if self.lora is not None:
            lead = y.shape[:-1]
            y = torch.addmm(y.reshape(-1, y.shape[-1]), F.linear(x, self.a_cat).reshape(-1, self.a_cat.shape[0]),
                            self.b_cat.t()).view(*lead, -1)
        return y, list(torch.split(y, self.sizes, dim=-1)) if len(self.sizes) > 1 else [y]


class DecodeEngine:
    """Static-shape prefill + decode of a Qwen2/Llama-family model for `batch` rows and `max_len` slots.

    Args:
        model: transformers causal LM (optionally peft-wrapped), on one device.
        batch: rows B (fixed: the graphs are captured for it).
        max_len: cache slots per row (prompt width + completion budget).
        bucket: attention length granularity of the decode graphs.
        graphs: capture CUDA graphs (default: when the model is on CUDA).
        fuse: one base GEMM for q/k/v and one for gate/up (NVFP4/MXFP4 grouped kernels, frozen BF16 weights
            concatenated), and one low-rank update per group for all LoRA adapters; False calls each module.

    Raises:
        ValueError: a model layout the engine does not run (see `supports`).
    """

    def __init__(self, model, batch: int, max_len: int, *, bucket: int = 512, graphs: bool | None = None,
                 fuse: bool = True):
        if not supports(model):
            raise ValueError("DecodeEngine runs Qwen2/Llama-family causal LMs (model.model.layers with self_attn "
                             f"q/k/v/o and mlp gate/up/down); got {type(_unwrap(model)).__name__}")
        base = _unwrap(model)
        self.model, self.cfg = model, base.config
        self.inner, self.lm_head = base.model, base.lm_head
        self.layers = list(self.inner.layers)
        emb = self.inner.embed_tokens.weight
        self.device, self.dtype = emb.device, emb.dtype
        cfg = self.cfg
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.batch, self.max_len, self.bucket = batch, max_len, bucket
        self.graphs = (self.device.type == "cuda") if graphs is None else graphs
        shape = (len(self.layers), batch, self.kv_heads, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.valid = torch.zeros(batch, max_len, dtype=torch.bool, device=self.device)
        pos = torch.arange(max_len, device=self.device).unsqueeze(0)
        cos, sin = self.inner.rotary_emb(emb[:1].unsqueeze(0), pos)  # [1, max_len, head_dim]
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)
        dt = self.dtype
        self._projs = [(_Proj([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], fuse, dt),
                        _Proj([layer.self_attn.o_proj], fuse, dt),
                        _Proj([layer.mlp.gate_proj, layer.mlp.up_proj], fuse, dt),
                        _Proj([layer.mlp.down_proj], fuse, dt)) for layer in self.layers]
        self._norms = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in self.layers]
        self._final_norm = self.inner.norm
        # decode state, read and advanced inside the graphs: the host loop only replays
        self._tok = torch.zeros(batch, dtype=torch.long, device=self.device)  # last sampled token
        self._pos = torch.zeros(batch, dtype=torch.long, device=self.device)  # its RoPE position
        self._slot = torch.zeros(1, dtype=torch.long, device=self.device)  # its cache slot
        self._col = torch.zeros(1, dtype=torch.long, device=self.device)  # its completion column
        self.tokens = torch.zeros(batch, max_len, dtype=torch.long, device=self.device)
        self.logps = torch.zeros(batch, max_len, dtype=torch.float32, device=self.device)
        self.ents = torch.zeros(batch, max_len, dtype=torch.float32, device=self.device)
        self._graphs: dict = {}
        self._pool = None

    # ---- the step ------------------------------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, span: int) -> torch.Tensor:
        """Logits [B, V] of the last of T tokens ids [B, T] at positions pos [B, T] written to cache slots
        `slots` [T]; attention over slots [0, span)."""
        bsz, t = ids.shape
        h_, kvh, d = self.heads, self.kv_heads, self.head_dim
        g = h_ // kvh
        hidden = self.inner.embed_tokens(ids)  # [B, T, H]
        cos, sin = self.cos[pos].unsqueeze(2), self.sin[pos].unsqueeze(2)  # [B, T, 1, d]
        keys = torch.arange(span, device=self.device)
        allowed = (keys.view(1, 1, span) <= slots.view(1, t, 1)) & self.valid[:, None, :span]  # [B, T, S]
        allowed = allowed | (keys.view(1, 1, span) == slots.view(1, t, 1))
        bias = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill_(~allowed, float("-inf"))
        bias = bias.unsqueeze(1).unsqueeze(1).expand(bsz, kvh, g, t, span).reshape(bsz * kvh, g * t, span)
        scale = d ** -0.5
        for i, layer in enumerate(self.layers):
            qkv, o_proj, gate_up, down = self._projs[i]
            n1, n2 = self._norms[i]
            y, (q, k, v) = qkv(_rms(hidden, n1))
            if y is not None:  # q and k side by side: one RoPE over both
                qk = y[..., :(h_ + kvh) * d].view(bsz, t, h_ + kvh, d)
            else:
                qk = torch.cat([q, k], -1).view(bsz, t, h_ + kvh, d)
            qk = torch.addcmul(qk * cos, _rotate_half(qk), sin)
            q, k = qk[:, :, :h_], qk[:, :, h_:]  # [B, T, h, d], [B, T, kvh, d]
            self.k_cache[i].index_copy_(2, slots, k.transpose(1, 2))
            self.v_cache[i].index_copy_(2, slots, v.view(bsz, t, kvh, d).transpose(1, 2))
            kk = self.k_cache[i, :, :, :span].reshape(bsz * kvh, span, d)
            vv = self.v_cache[i, :, :, :span].reshape(bsz * kvh, span, d)
            qg = q.transpose(1, 2).reshape(bsz * kvh, g * t, d)  # head kv*g + j -> row (j, t) of group kv
            scores = torch.baddbmm(bias, qg, kk.transpose(1, 2), alpha=scale)  # [B*kvh, g*T, S]
            p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            o = torch.bmm(p, vv).view(bsz, kvh, g, t, d).permute(0, 3, 1, 2, 4).reshape(bsz, t, h_ * d)
            hidden = hidden + o_proj(o)[1][0]
            _, (gate, up) = gate_up(_rms(hidden, n2))
            hidden = hidden + down(F.silu(gate) * up)[1][0]
        return self.lm_head(_rms(hidden[:, -1], self._final_norm))  # [B, V]

    def _sample(self, logits: torch.Tensor, temperature: float, top_p: float):
        logits = logits.float()
        if temperature <= 0:
            logp = torch.log_softmax(logits, dim=-1)
            tok = logits.argmax(-1)
            return tok, logp.gather(-1, tok[:, None]).squeeze(1), torch.zeros_like(logp[:, 0])
        logits = logits / temperature
        if top_p < 1.0:
            from qerl.rl.rollout import _top_p_filter
            logits = _top_p_filter(logits, top_p)
        logp = torch.log_softmax(logits, dim=-1)  # [B, V]
        gumbel = -torch.log(-torch.log(torch.rand_like(logp).clamp_(1e-20, 1.0)))
        tok = (logp + gumbel).argmax(-1)
        probs = logp.exp()
        ent = -(probs * logp.masked_fill(probs == 0, 0.0)).sum(-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(1), ent

    def _record(self, tok, logp, ent) -> None:
        """Store the sampled column and advance the state (token, position, slot, column)."""
        self.tokens.index_copy_(1, self._col, tok[:, None])
        self.logps.index_copy_(1, self._col, logp[:, None])
        self.ents.index_copy_(1, self._col, ent[:, None])
        self._tok.copy_(tok)
        self._pos.add_(1)
        self._slot.add_(1)
        self._col.add_(1)

    def _decode_step(self, span: int, temperature: float, top_p: float) -> None:
        logits = self._forward(self._tok[:, None], self._pos[:, None], self._slot, span)
        self.valid.index_fill_(1, self._slot, True)
        self._record(*self._sample(logits, temperature, top_p))

    def _span(self, slot: int) -> int:
        return min(self.max_len, -(-(slot + 1) // self.bucket) * self.bucket)

    def _run_step(self, span: int, temperature: float, top_p: float) -> None:
        if not self.graphs:
            self._decode_step(span, temperature, top_p)
            return
        key = (span, float(temperature), float(top_p))
        graph = self._graphs.get(key)
        if graph is None:
            state = [t.clone() for t in (self._tok, self._pos, self._slot, self._col, self.valid)]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up outside the graph (Triton autotuning, lazy inits)
                for _ in range(2):
                    self._decode_step(span, temperature, top_p)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self._pool):
                self._decode_step(span, temperature, top_p)
            self._graphs[key] = graph
            for live, saved in zip((self._tok, self._pos, self._slot, self._col, self.valid), state):
                live.copy_(saved)  # the warm-up steps advanced the state; the replay below is the real step
        graph.replay()

    def spans(self, prompt_len: int, max_new_tokens: int) -> dict[int, int]:
        """{attention span (bucket): decode steps in it} of a generation of this shape (its graphs and their use)."""
        steps: dict[int, int] = {}
        for slot in range(prompt_len, prompt_len + max_new_tokens - 1):  # decode step t feeds slot P + t - 1
            steps[self._span(slot)] = steps.get(self._span(slot), 0) + 1
        return steps

    def _enter_bucket(self, span: int, room: int) -> None:
        """Place the decode state `room` slots before the bucket's end, so the next steps stay inside it."""
        self._slot.fill_(max(span - room, 0))
        self._pos.fill_(max(span - room, 0))
        self._col.zero_()

    def capture(self, prompt_len: int, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0) -> int:
        """Capture every decode graph a generation of this shape will replay (returns how many exist)."""
        for span in sorted(self.spans(prompt_len, max_new_tokens)):
            self._enter_bucket(span, 4)  # warm-ups and the replay write slots inside the bucket
            self._run_step(span, temperature, top_p)
        self.valid.zero_()
        return len(self._graphs)

    def step_seconds(self, span: int, reps: int, temperature: float = 1.0, top_p: float = 1.0) -> float:
        """Mean wall time of one decode step in bucket `span` (its graph replayed `reps` times after one untimed
        replay; CUDA only, after `capture`). For throughput measurements; the cache's contents are arbitrary."""
        graph = self._graphs[(span, float(temperature), float(top_p))]
        self._enter_bucket(span, reps + 2)
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    def prefill(self, prompt_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Write the prompts' K/V (slots [0, P)) and return the logits [B, V] after the last prompt column."""
        bsz, plen = prompt_ids.shape
        if bsz != self.batch:
            raise ValueError(f"DecodeEngine was built for batch {self.batch}, got {bsz} prompts")
        self.valid.zero_()
        self.valid[:, :plen] = attention_mask.bool()
        pos = (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)
        slots = torch.arange(plen, device=self.device)
        return self._forward(prompt_ids, pos, slots, plen)

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, eos_ids=(), force_length: bool = False,
                 check_every: int = 32) -> EngineOutput:
        """Sample up to `max_new_tokens` tokens per row after left-padded prompts [B, P].

        Args:
            prompt_ids, attention_mask: [B, P] on the model's device.
            max_new_tokens: completion budget L (P + L <= max_len).
            temperature, top_p: the sampling distribution (temperature 0 = greedy).
            eos_ids: token ids that end a row (its later tokens are padding, masked by `lengths`).
            force_length: ignore EOS and sample all L tokens (throughput measurements, as the paper's tables).
            check_every: steps between host checks for "every row has ended" (each check is one sync).

        Raises:
            ValueError: batch mismatch, or P + L beyond max_len.
        """
        bsz, plen = prompt_ids.shape
        if plen + max_new_tokens > self.max_len:
            raise ValueError(f"prompt width {plen} + max_new_tokens {max_new_tokens} exceeds the engine's "
                             f"max_len {self.max_len}")
        was_training = self.model.training
        self.model.eval()
        for projs in self._projs:  # adapters may have changed since the last generation
            for proj in projs:
                proj.refresh()
        dev = self.device
        eos = torch.tensor(sorted(set(int(e) for e in eos_ids)) or [-1], dtype=torch.long, device=dev)
        logits = self.prefill(prompt_ids, attention_mask)
        self._pos.copy_(attention_mask.long().sum(-1))  # the first sampled token's position and slot
        self._slot.fill_(plen)
        self._col.zero_()
        self._record(*self._sample(logits, temperature, top_p))
        self._pos.sub_(1)  # _record advanced them; the first decode step feeds that token at (pos, slot P)
        self._slot.sub_(1)
        steps = max_new_tokens
        for t in range(1, max_new_tokens):
            if not force_length and t % check_every == 0 and bool(torch.isin(self.tokens[:, :t], eos).any(1).all()):
                steps = t
                break
            self._run_step(self._span(plen + t - 1), temperature, top_p)
        tokens, logps, ents = (b[:, :steps].clone() for b in (self.tokens, self.logps, self.ents))
        if force_length:
            lengths = torch.full((bsz,), steps, dtype=torch.long, device=dev)
            finished = torch.zeros(bsz, dtype=torch.bool, device=dev)
        else:
            hit = torch.isin(tokens, eos)  # [B, L]
            finished = hit.any(1)
            lengths = torch.where(finished, hit.float().argmax(1) + 1, torch.full_like(finished, steps, dtype=torch.long))
        self.model.train(was_training)
        return EngineOutput(tokens, logps, ents, lengths, finished)
