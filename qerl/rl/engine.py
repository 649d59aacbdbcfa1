"""A static-shape decoder for rollouts: preallocated KV cache, fused decode-step kernels, CUDA graphs per cache bucket.

Why: transformers' generate with a dynamic cache spends most of a decode step in Python and launch overhead
(47.7 tok/s for a 7B model at batch 1 on an H200, where the weights alone allow several hundred). This engine reads
the model's own modules (embeddings, RMSNorms, q/k/v/o/gate/up/down whatever they are: nn.Linear, QuantLinear,
bitsandbytes Linear4bit, peft LoRA wrappers around any of them; the LM head) and runs a fixed-shape decode step that
is captured once per attention bucket as a CUDA graph and replayed.

It does not modify the model it reads. Its projection groups (qerl.rl.engine_groups) ask the layers for what they
need through their public API and keep their own copies only of what is small (the LoRA factors, the q/k/v biases,
for BF16 bases the concatenated q/k/v weights); 4-bit weights are read in place on CUDA (a q/k/v or gate/up group's
layers re-homed once into one allocation, values unchanged). RMSNorm weights are read in
place, so AQN noise written into them (qerl.noise) is seen by the next replay and its exact restore by the one after.

One decoder layer of the decode step (batch B, one token per row), kernels in brackets:
    x = rmsnorm(h)                                          [qerl_kernels.decode.rmsnorm; fused with the residual add]
    t = x A_qkv^T                                           [the three LoRA down-products at once, in the norm's
                                                             kernel (rmsnorm_lora, split over the hidden size) at
                                                             batch 1; else the norm kernel and cuBLAS]
    y = x W_qkv^T                                           [NVFP4: one qerl_kernels.fp4_gemm over q/k/v, the layers'
                                                             buffers re-homed into one allocation
                                                             (share_kernel_storage); BF16: one cuBLAS GEMM]
    q, cache[slot] = rope(y + t B^T + b)                    [qerl_kernels.decode.qkv_rope_cache]
    a = attention(q, cache[:slot + 1])                      [qerl_kernels.decode.decode_attention: split-K + combine,
                                                             one kernel when batch x kv_heads fills the GPU]
    h = h + a W_o^T + (a A_o^T) B_o^T                       [A-product: in the attention's combine kernel where there
                                                             is one, else qerl_kernels.decode.lora_down at batch 1,
                                                             else cuBLAS; NVFP4: one fp4_gemm with LoRA and
                                                             residual in its epilogue; BF16: addmm_ into h + addmm_]
    x = rmsnorm(h); t = x A_gu^T; y = x W_gu^T              [as above; BF16: gate and up as two cuBLAS GEMMs]
    m = silu(y_g + t_g B_g^T) * (y_u + t_u B_u^T)           [qerl_kernels.decode.silu_mul; at batch 1 with the
                                                             down-products m A_d^T (silu_mul_lora: one launch)]
    h = h + m W_d^T + (m A_d^T) B_d^T                       [as o]
Measured on an H200 (results/measured/h200/step_trace.run9.md, 7B): 16 kernels per layer for NVFP4 + LoRA and 21
for BF16 + LoRA (cuBLAS adds a split-K reduction to the skinny LoRA products; the BF16 addmm copies its input), against
31 and 33 before this engine; the LM head and the sampling (temperature, top-p, Gumbel-max with the default CUDA
generator, log-prob and entropy of the sampling distribution, as qerl.rl.rollout.sample) follow, inside the same graph.
With the Triton kernels, where it is faster (sample_gumbel_pays: from 16 rows; without top-p also any batch of a
vocabulary up to 65,536) the sampling is one kernel (qerl_kernels.decode.sample_gumbel: the same distribution, its
uniforms from Philox keyed by a seed drawn from the device RNG at each generate and the step; the nucleus by bisection,
no sort), where torch's ops make ~35 passes over the [B, vocabulary] float32 logits and sort them for top-p
(SmolLM2-135M at 128 rows on an H100: 282 -> 48 us a step without top-p, 1,287 -> 170 us at the evaluations' 0.95).
Since the H200 count: one attention kernel when batch x kv_heads fills the GPU, the BF16 residual added in place;
the attention skips the whole key blocks of a row's left padding (its first valid slot is kept per row at the
prefill; the same sums bit for bit). SmolLM2-135M
with LoRA rank 32 at 128 rows, all of it (H100, one call, results/measured/h100/small/share_gpu/engine_kernels.md): 601
-> 433 kernels a step, 297 -> 336 steps/s alone, and with 8 processes sharing the GPU 71.7k -> 94.2k rows x steps/s in
all (+31 %); that count had the norm computing the q/k/v and gate/up LoRA down-products at hidden sizes <= 2048,
which a later per-launch measurement found slower than the norm kernel + cuBLAS
(qerl_kernels.decode.LORA_SPLIT_MAX_ROWS: SmolLM2-135M's norm + q/k/v 7.7-7.9 vs 4.5-4.8 us at 8-256 rows, H100).
At batch 1 (up to each group's qerl_kernels.decode.LORA_SPLIT_MAX_ROWS: q/k/v 2 rows, gate/up and down 4, o 8; 7B, H100,
call 89: QeRL 471.6 -> 510.3 tok/s at batch 2) the LoRA down-products of every group are one split kernel each, fused
with the norm for q/k/v and gate/up (7B, H100, kernels.notes.md call 16: 16 -> 12 kernels a layer, a graph-replayed step
4,451 -> 4,058 us for NVFP4 + LoRA and 7,268 -> 6,920 us for BF16 + LoRA) and with the MLP activation for down
(silu_mul_lora; call 34: 12 -> 11 a layer, 4,127 -> 4,052 us and 7,049 -> 6,971 us). Wherever the attention is split
over the keys (7B: batch <= 65), o's LoRA down-products are the attention combine kernel's (decode_attention's lora_a;
call 37: one kernel a layer fewer, QeRL's step 4,105 -> 4,008 us at batch 1 and 4,622 -> 4,533 us of kernels at batch 8,
BF16 LoRA's 6,980 -> 6,887 and 7,687 -> 7,558 us; call 39 at batch 64: 7,538 -> 7,497 and 9,270 -> 9,161 us).
Layers the fused path cannot read (merged or DoRA adapters, several active adapters, bitsandbytes bases unless marked
for a dequantized decode: config model.nf4_decode, baselines.nf4.mark_decode_dequantized) are called
as modules, with their LoRA applied by the same kernels where it can be.

Layout: KV cache [layers, B, kv_heads, max_len, head_dim]; slot j of a row holds its j-th column (left-padded
prompt, then the completion); `valid[b, j]` marks real tokens; a query at slot i attends to valid slots <= i (and
always to itself). Decode step t attends over the first S slots, S the smallest bucket (multiple of `bucket`)
covering P + t + 1 (one graph per bucket); the attention kernel stops at the current slot. The prefill runs the
same projections with torch attention over the prompt.

Kernels: `kernels="auto"` runs the Triton decode kernels on CUDA (fp16/bf16, head_dim >= 32) and their torch
references elsewhere (the CPU path: same numerics up to rounding order); "triton" forces the kernels (CPU tests
under TRITON_INTERPRET=1), "torch" the references. `fuse=False` calls every projection module as it is (the
unfused baseline).

    eng = DecodeEngine(model, batch=8, max_len=256 + 2048)
    out = eng.generate(prompt_ids, attention_mask, max_new_tokens=2048, temperature=1.0, eos_ids=[151645],
                       force_length=True)          # out.tokens [8, 2048], out.logp, out.entropy, out.lengths
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from qerl_kernels.decode import (LORA_SPLIT_MAX_ROWS, decode_attention, lora_split_max_rows, qkv_rope_cache, rmsnorm,
                                  rmsnorm_lora, sample_gumbel, sample_gumbel_pays, silu_mul, silu_mul_lora)
from qerl.rl.engine_groups import Group
from qerl.rl.sampling import gumbel_sample

__all__ = ["DecodeEngine", "EngineOutput", "supports"]

#: bytes of float32 attention scores one prefill chunk of rows may hold (the prefill's attention runs in row chunks)
PREFILL_SCORES_BYTES = 2**28
#: bytes of one float32 [rows, prompt width, intermediate] MLP tensor a prefill pass may hold: wider batches run the
#: whole layer stack in row chunks. On an H100 (small scale, run 10) 256-row evaluations of MATH-500 (prompts padded
#: to ~940 tokens) held 17-25 GB per process, 1.41 GB per such tensor and several at once in the MLP, and ran out of
#: memory beside 7 other jobs
PREFILL_MLP_BYTES = 2**29


@dataclass
class EngineOutput:
    tokens: torch.Tensor  # [B, L] sampled tokens (pad after a row's end)
    logp: torch.Tensor  # [B, L] float32 log-prob of each token under its sampling distribution
    entropy: torch.Tensor  # [B, L] float32 entropy (nats) of that distribution
    lengths: torch.Tensor  # [B] tokens up to and including the stop (EOS), or L
    finished: torch.Tensor  # [B] True where an EOS ended the row


def _unwrap(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


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


def _eps(norm) -> float:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)


class DecodeEngine:
    """Static-shape prefill + decode of a Qwen2/Llama-family model for `batch` rows and `max_len` slots.

    Args:
        model: transformers causal LM (optionally peft-wrapped), on one device. Not modified (see the module doc).
        batch: rows B (fixed: the graphs are captured for it).
        max_len: cache slots per row (prompt width + completion budget).
        bucket: attention length granularity of the decode graphs.
        graphs: capture CUDA graphs (default: when the model is on CUDA).
        fuse: the fused step (grouped projections, LoRA through the kernels); False calls every module.
        kernels: "auto", "triton" or "torch" (see the module docstring).
        copy_dense_qkv: keep a concatenated copy of BF16 q/k/v weights (one GEMM instead of three).

    Raises:
        ValueError: a model layout the engine does not run (see `supports`), or an unknown `kernels` value.
    """

    def __init__(self, model, batch: int, max_len: int, *, bucket: int = 512, graphs: bool | None = None,
                 fuse: bool = True, kernels: str = "auto", copy_dense_qkv: bool = True):
        if not supports(model):
            raise ValueError("DecodeEngine runs Qwen2/Llama-family causal LMs (model.model.layers with self_attn "
                             f"q/k/v/o and mlp gate/up/down); got {type(_unwrap(model)).__name__}")
        if kernels not in ("auto", "triton", "torch"):
            raise ValueError(f"DecodeEngine: kernels must be 'auto', 'triton' or 'torch', got {kernels!r}")
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
        if kernels == "auto":
            kernels = "triton" if (fuse and self.device.type == "cuda" and self.head_dim >= 32 and
                                   self.dtype in (torch.float16, torch.bfloat16)) else "torch"
        self.use_triton = kernels == "triton"
        shape = (len(self.layers), batch, self.kv_heads, max_len, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.valid = torch.zeros(batch, max_len, dtype=torch.bool, device=self.device)
        self._first = torch.zeros(batch, dtype=torch.int32, device=self.device)  # each row's first valid slot
        pos = torch.arange(max_len, device=self.device).unsqueeze(0)
        cos, sin = self.inner.rotary_emb(emb[:1].unsqueeze(0), pos)  # [1, max_len, head_dim]
        self.cos, self.sin = cos[0].to(self.dtype).contiguous(), sin[0].to(self.dtype).contiguous()
        kw = dict(fuse=fuse, dtype=self.dtype, in_place=self.device.type == "cuda")
        rows = lora_split_max_rows() if self.use_triton else dict.fromkeys(LORA_SPLIT_MAX_ROWS, 0)
        self._groups = [(Group([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
                               copy_dense=copy_dense_qkv, split_rows=rows["q/k/v"], **kw),
                         Group([layer.self_attn.o_proj], copy_dense=False, split_rows=rows["o"], **kw),
                         Group([layer.mlp.gate_proj, layer.mlp.up_proj], copy_dense=False, split_rows=rows["gate/up"],
                               **kw),
                         Group([layer.mlp.down_proj], copy_dense=False, split_rows=rows["down"], **kw))
                        for layer in self.layers]
        if self.graphs and not self.use_triton and "fp4" in self.group_kinds():
            # a 4-bit weight without the Triton kernels (float32 activations) is dequantized by the torch reference,
            # which builds small index tensors on the host: not capturable, so this engine replays no graphs
            self.graphs = False
        self._norms = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in self.layers]
        self._final_norm = self.inner.norm
        # decode state, read and advanced inside the graphs: the host loop only replays
        self._tok = torch.zeros(batch, dtype=torch.long, device=self.device)  # last sampled token
        self._pos = torch.zeros(batch, dtype=torch.long, device=self.device)  # its RoPE position
        self._slot = torch.zeros(1, dtype=torch.long, device=self.device)  # its cache slot
        self._col = torch.zeros(1, dtype=torch.long, device=self.device)  # its completion column
        self._seed = torch.zeros(1, dtype=torch.int64, device=self.device)  # the fused sampler's key, per generate
        self.tokens = torch.zeros(batch, max_len, dtype=torch.long, device=self.device)
        self.logps = torch.zeros(batch, max_len, dtype=torch.float32, device=self.device)
        self.ents = torch.zeros(batch, max_len, dtype=torch.float32, device=self.device)
        self._graphs: dict = {}
        self._pool = None

    def group_kinds(self) -> set[str]:
        """The projection kinds in use ("fp4", "dense", "bases", "call"; see qerl.rl.engine_groups.Group)."""
        return {g.kind for groups in self._groups for g in groups}

    # ---- the step ------------------------------------------------------------------------------------------------
    def _layers_forward(self, hidden: torch.Tensor, pos: torch.Tensor, slot: torch.Tensor, attend,
                        rows: slice = slice(None)) -> torch.Tensor:
        """The decoder layers over hidden [B, T, H] (the cache rows `rows`); `attend(i, q [B, T, heads, d], a_o) ->
        (a [B, T, heads * d], t)` after q/k/v of layer i are written at slots slot..slot+T-1, t = a a_o^T (o_proj's
        LoRA down-products, a_o its stacked A factors or None) where the attention computed it, else None. Returns
        the final-normed hidden state [B, T, H]."""
        tri = self.use_triton and hidden.shape[1] == 1
        kt = dict(use_triton=tri)
        n_layers = len(self.layers)
        x, t = self._norm(hidden, self._norms[0][0], self._groups[0][0], tri)
        for i in range(n_layers):
            qkv, o_proj, gate_up, down = self._groups[i]
            (q, k, v), t, bias = qkv.project(x, t)
            q = qkv_rope_cache(q, k, v, t, qkv.lora_b if t is not None else None, bias, self.cos, self.sin, pos,
                               slot, self.k_cache[i, rows], self.v_cache[i, rows], **kt)
            a, t = attend(i, q, o_proj.a_cat if tri else None)  # t: o's LoRA down-products, if computed
            hidden = o_proj.residual(a, hidden, t=t)
            x, t = self._norm(hidden, self._norms[i][1], gate_up, tri)
            (g, u), t, _ = gate_up.project(x, t)
            lb = gate_up.lora_b if t is not None else None
            if tri and down.splits_lora(g):  # the activation and down's LoRA down-product in one launch
                m, td = silu_mul_lora(g, u, t, lb, down.a_cat, use_triton=True)
                hidden = down.residual(m, hidden, t=td)
            else:
                m = silu_mul(g, u, t, lb, **kt)
                hidden = down.residual(m, hidden)
            if i + 1 < n_layers:
                x, t = self._norm(hidden, self._norms[i + 1][0], self._groups[i + 1][0], tri)
            else:
                x = _rmsnorm(hidden, self._final_norm, None, tri)
        return x

    def _norm(self, hidden: torch.Tensor, norm, group: Group, tri: bool):
        """(x, t): the normed input of `group` and, where one kernel computes both (the Triton decode step and
        `Group.splits_lora`: LoRA adapters, at most qerl_kernels.decode.lora_split_max_rows rows), its LoRA
        down-products; else t None (the group computes them)."""
        if tri and group.splits_lora(hidden):
            return rmsnorm_lora(hidden, norm.weight, _eps(norm), group.a_cat, use_triton=True)
        return _rmsnorm(hidden, norm, None, tri), None

    def _decode_logits(self, span: int) -> torch.Tensor:
        """Logits [B, V] of one decode step: token _tok at position _pos into cache slot _slot, attention < span."""
        bsz = self.batch
        scale = self.head_dim ** -0.5

        def attend(i, q, lora_a):
            out = decode_attention(q[:, 0], self.k_cache[i], self.v_cache[i], self.valid, self._slot, span, scale,
                                   use_triton=self.use_triton, first=self._first, lora_a=lora_a)
            a, t = out if lora_a is not None else (out, None)
            return a.view(bsz, 1, -1), (t.view(bsz, 1, -1) if t is not None else None)

        hidden = self.inner.embed_tokens(self._tok[:, None])  # [B, 1, H]
        x = self._layers_forward(hidden, self._pos[:, None], self._slot, attend)
        return self.lm_head(x[:, -1])  # [B, V]

    def _prefill_logits(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] after the prompts ids [B, P] (positions pos), their K/V written to slots [0, P): in row
        chunks whose float32 MLP tensors stay under PREFILL_MLP_BYTES (each row's numbers are its own)."""
        bsz, t = ids.shape
        inter = self.cfg.intermediate_size
        rows = max(1, min(bsz, PREFILL_MLP_BYTES // (t * inter * 4)))
        if rows >= bsz:
            return self._prefill_rows(ids, pos, slice(None))
        return torch.cat([self._prefill_rows(ids[lo:lo + rows], pos[lo:lo + rows], slice(lo, lo + rows))
                          for lo in range(0, bsz, rows)])

    def _prefill_rows(self, ids: torch.Tensor, pos: torch.Tensor, cache_rows: slice) -> torch.Tensor:
        """`_prefill_logits` for the prompts of the cache rows `cache_rows` (ids, pos: those rows)."""
        bsz, t = ids.shape
        h_, kvh, d = self.heads, self.kv_heads, self.head_dim
        g = h_ // kvh
        keys = torch.arange(t, device=self.device)
        allowed = (keys.view(1, 1, t) <= keys.view(1, t, 1)) & self.valid[cache_rows, None, :t]  # [B, T, S]
        blocked = ~(allowed | (keys.view(1, 1, t) == keys.view(1, t, 1)))  # [B, T, S]
        # the mask stays one [B, T, S] boolean, filled into each chunk's scores (a bias materialised for every head,
        # [B * heads, T, S] in bf16, was 1.4 GiB for 93 rows of 940-token MATH prompts: the H100's run 11 died of it)
        zero = torch.zeros((), dtype=self.dtype, device=self.device)

        # rows per attention chunk: the float32 scores of a chunk stay under PREFILL_SCORES_BYTES (384 rows of long
        # MATH prompts at once asked for 13.5 GiB and ran out of memory beside other jobs on an H100)
        rows = max(1, min(bsz, PREFILL_SCORES_BYTES // (kvh * g * t * t * 4)))

        def attend(i, q, lora_a):  # q [B, T, h, d]; lora_a unused (o's LoRA down-products: the group's own)
            kk = self.k_cache[i, cache_rows, :, :t].reshape(bsz * kvh, t, d)
            vv = self.v_cache[i, cache_rows, :, :t].reshape(bsz * kvh, t, d)
            qg = q.transpose(1, 2).reshape(bsz * kvh, g * t, d)  # head kv*g + j -> row (j, t) of group kv
            out = []
            for lo in range(0, bsz * kvh, rows * kvh):
                hi = min(lo + rows * kvh, bsz * kvh)
                scores = torch.baddbmm(zero.expand(hi - lo, g * t, t), qg[lo:hi], kk[lo:hi].transpose(1, 2),
                                       alpha=d ** -0.5)
                mask = blocked[lo // kvh:hi // kvh, None, None].expand(-1, kvh, g, t, t)
                scores.view(-1, kvh, g, t, t).masked_fill_(mask, float("-inf"))
                p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)  # [rows*kvh, g*T, S]
                out.append(torch.bmm(p, vv[lo:hi]))
            o = out[0] if len(out) == 1 else torch.cat(out)
            return o.view(bsz, kvh, g, t, d).permute(0, 3, 1, 2, 4).reshape(bsz, t, h_ * d), None

        hidden = self.inner.embed_tokens(ids)
        x = self._layers_forward(hidden, pos, torch.zeros(1, dtype=torch.long, device=self.device), attend,
                                 cache_rows)
        return self.lm_head(x[:, -1])

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
        logits = self._decode_logits(span)
        self.valid.index_fill_(1, self._slot, True)
        if self._fused_sampling(temperature, top_p):
            self._record(*sample_gumbel(logits, temperature, self._seed, self._col, top_p))
        else:
            self._record(*gumbel_sample(logits, temperature, top_p))

    def _fused_sampling(self, temperature: float, top_p: float) -> bool:
        """Whether the decode steps sample with the one-kernel sampler (Triton kernels, temperature > 0, and where
        qerl_kernels.decode.sample_gumbel_pays measured it faster)."""
        return self.use_triton and temperature > 0 and sample_gumbel_pays(self.batch, self.cfg.vocab_size, top_p)

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

    def refresh(self) -> None:
        """Copy the adapters' current weights in (an optimizer step changes them in place); if the model's base
        tensors were replaced (e.g. load_state_dict re-prepared a QuantLinear), rebuild and drop the graphs."""
        rebuilt = [g.refresh() for groups in self._groups for g in groups]
        if any(rebuilt):
            self._graphs.clear()

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

    @torch.no_grad()
    def capture(self, prompt_len: int, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0) -> int:
        """Capture every decode graph a generation of this shape will replay (returns how many exist)."""
        self.refresh()
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

    @torch.no_grad()
    def decode_steps(self, span: int, n: int, temperature: float = 1.0, top_p: float = 1.0) -> None:
        """Run `n` eager (not graph-replayed) decode steps inside bucket `span`: the kernels a graph replay launches,
        one by one, for profilers (qerl.profiling.step_trace; call `refresh` first if the adapters changed). The
        cache's contents are arbitrary."""
        self._enter_bucket(span, n + 2)
        for _ in range(n):
            self._decode_step(span, temperature, top_p)

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Write the prompts' K/V (slots [0, P)) and return the logits [B, V] after the last prompt column."""
        bsz, plen = prompt_ids.shape
        if bsz != self.batch:
            raise ValueError(f"DecodeEngine was built for batch {self.batch}, got {bsz} prompts")
        self.valid.zero_()
        self.valid[:, :plen] = attention_mask.bool()
        self._first.copy_(attention_mask.long().argmax(-1))  # left padding: every slot before the first real token
        pos = (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)
        return self._prefill_logits(prompt_ids, pos)

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, eos_ids=(), force_length: bool = False,
                 check_every: int = 8, row_limits: torch.Tensor | None = None, min_active: int = 0) -> EngineOutput:
        """Sample up to `max_new_tokens` tokens per row after left-padded prompts [B, P].

        The model is switched to eval mode for the generation and back to its previous mode afterwards.

        Args:
            prompt_ids, attention_mask: [B, P] on the model's device.
            max_new_tokens: completion budget L (P + L <= max_len).
            temperature, top_p: the sampling distribution (temperature 0 = greedy).
            eos_ids: token ids that end a row (its later tokens are padding, masked by `lengths`).
            force_length: ignore EOS and sample all L tokens (throughput measurements, as the paper's tables).
            check_every: steps between host checks for "every row has ended" (each check is one sync, a few
                microseconds of an idle GPU against a decode step's milliseconds; the steps after the last row ended
                are wasted: the small scale's GSM8K rollouts of run 12, estimated from their kept samples (a subset of
                each step's rows, so the saving is an upper bound), averaged 152 decode steps at every 32 and 141 at
                every 8, their longest kept row 137).
            row_limits: [B] tokens each row may have; a row counts as ended at its limit (its later tokens are the
                caller's to drop). None: max_new_tokens for every row.
            min_active: stop at a check that finds fewer rows still running than this (a continuous-batching caller
                refills the batch then: qerl.evaluate.stream); 0 runs until every row has ended.

        Raises:
            ValueError: batch mismatch, or P + L beyond max_len.
        """
        bsz, plen = prompt_ids.shape
        if plen + max_new_tokens > self.max_len:
            raise ValueError(f"prompt width {plen} + max_new_tokens {max_new_tokens} exceeds the engine's "
                             f"max_len {self.max_len}")
        was_training = self.model.training
        self.model.eval()
        try:
            self.refresh()  # adapters may have changed since the last generation
            dev = self.device
            eos = torch.tensor(sorted(set(int(e) for e in eos_ids)) or [-1], dtype=torch.long, device=dev)
            if self._fused_sampling(temperature, top_p):  # its key, from the device's torch RNG (the caller seeds it)
                self._seed.random_(0, 2**62)
            logits = self.prefill(prompt_ids, attention_mask)
            self._pos.copy_(attention_mask.long().sum(-1))  # the first sampled token's position and slot
            self._slot.fill_(plen)
            self._col.zero_()
            self._record(*gumbel_sample(logits, temperature, top_p))
            self._pos.sub_(1)  # _record advanced them; the first decode step feeds that token at (pos, slot P)
            self._slot.sub_(1)
            steps = max_new_tokens
            for t in range(1, max_new_tokens):
                if not force_length and t % check_every == 0:
                    ended = torch.isin(self.tokens[:, :t], eos).any(1)
                    if row_limits is not None:
                        ended |= row_limits <= t
                    running = int((~ended).sum())  # the check's one sync
                    if running == 0 or running < min_active:
                        steps = t
                        break
                self._run_step(self._span(plen + t - 1), temperature, top_p)
            tokens, logps, ents = (b[:, :steps].clone() for b in (self.tokens, self.logps, self.ents))
        finally:
            self.model.train(was_training)
        if force_length:
            lengths = torch.full((bsz,), steps, dtype=torch.long, device=dev)
            finished = torch.zeros(bsz, dtype=torch.bool, device=dev)
        else:
            hit = torch.isin(tokens, eos)  # [B, L]
            finished = hit.any(1)
            lengths = torch.where(finished, hit.float().argmax(1) + 1,
                                  torch.full_like(finished, steps, dtype=torch.long))
        return EngineOutput(tokens, logps, ents, lengths, finished)


def _rmsnorm(h: torch.Tensor, norm, add, use_triton: bool) -> torch.Tensor:
    """RMSNorm with the module's weight, read at call time (AQN noise written into it is seen)."""
    return rmsnorm(h, norm.weight, _eps(norm), add, use_triton=use_triton)
