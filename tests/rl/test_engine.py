"""The static-shape decode engine computes what the model computes: prefill logits, sampled log-probs and entropies
equal a teacher-forced transformers forward (left padding, GQA, buckets, LoRA, NVFP4 bases); EOS and lengths; the
fused Triton decode kernels (interpreter on CPU) give the same tokens; the engine leaves the model untouched; AQN
noise in the norms changes its tokens and the restored run is bit-identical."""
from __future__ import annotations

import pytest
import torch

from qerl.data.prompts import build_prompt
from qerl.models.tiny import build_model, build_tokenizer
from qerl.rl.engine import DecodeEngine, supports
from qerl.rl.rollout import sequence_logprobs
from qerl_kernels import PreparedFP4

QUESTIONS = ("Ann has 3 pens . How many pens does Ann have now ?",
             "Ben has 12 cups . Ben eats 5 cups . How many cups does Ben have now ?",
             "Cal has 7 hats . Cal buys 9 hats . Cal loses 2 hats . How many hats does Cal have now ?")


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, seed=1).eval()
    enc = tok([build_prompt(q, tok, "none") for q in QUESTIONS], return_tensors="pt", padding=True,
              padding_side="left", add_special_tokens=False)
    return model, tok, enc["input_ids"], enc["attention_mask"]


def _lora(model, seed=0):
    import copy

    import peft

    from qerl.layers.lora import lora_config
    torch.manual_seed(seed)
    m = peft.get_peft_model(copy.deepcopy(model), lora_config(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], lora_dropout=0.0))
    for n, p in m.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.3)  # a non-zero adapter, so a missed delta shows
    return m.eval()


def _nvfp4(model):
    import copy

    from qerl.layers import NVFP4Config, quantize_
    return quantize_(copy.deepcopy(model), NVFP4Config()).eval()


def _check_against_forward(model, ids, attn, out, atol=1e-4):
    full_ids = torch.cat([ids, out.tokens], 1)
    full_attn = torch.cat([attn, torch.ones_like(out.tokens)], 1)
    with torch.no_grad():
        logp, ent = sequence_logprobs(model, full_ids, full_attn, ids.shape[1], with_entropy=True)
    assert torch.allclose(out.logp, logp, atol=atol), (out.logp - logp).abs().max()
    return logp, ent


@pytest.mark.parametrize("variant", ["plain", "lora", "nvfp4", "nvfp4+lora"])
def test_greedy_generation_matches_teacher_forcing(setup, variant):
    model, tok, ids, attn = setup
    if "nvfp4" in variant:
        model = _nvfp4(model)
    if "lora" in variant:
        model = _lora(model)
    assert supports(model)
    eng = DecodeEngine(model, batch=ids.shape[0], max_len=ids.shape[1] + 20, bucket=8)
    with torch.no_grad():
        prefill = eng.prefill(ids, attn)
        ref = model(input_ids=ids, attention_mask=attn,
                    position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits[:, -1]
    assert torch.allclose(prefill, ref, atol=1e-4)
    out = eng.generate(ids, attn, max_new_tokens=20, temperature=0.0, force_length=True)
    assert out.tokens.shape == (3, 20) and (out.lengths == 20).all()
    logp, _ = _check_against_forward(model, ids, attn, out)
    # greedy: each token is the argmax of the teacher-forced distribution (its log-prob is the row max)
    full = torch.cat([ids, out.tokens], 1)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=torch.ones_like(full) * torch.cat(
            [attn, torch.ones_like(out.tokens)], 1), position_ids=(torch.cat([attn, torch.ones_like(out.tokens)], 1)
                                                               .cumsum(-1) - 1).clamp(min=0)).logits
    pred = logits[:, ids.shape[1] - 1:-1].argmax(-1)
    assert (pred == out.tokens).float().mean() > 0.99


def test_adapter_updates_between_generations_are_seen(setup):
    model, tok, ids, attn = setup
    model = _lora(model)
    eng = DecodeEngine(model, batch=3, max_len=ids.shape[1] + 8)
    eng.generate(ids, attn, max_new_tokens=8, temperature=0.0, force_length=True)
    with torch.no_grad():  # an optimizer step changes adapter weights in place
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(-2.0)
    out = eng.generate(ids, attn, max_new_tokens=8, temperature=0.0, force_length=True)
    _check_against_forward(model, ids, attn, out)


def test_sampling_logprobs_and_entropy_match_teacher_forcing(setup):
    model, tok, ids, attn = setup
    eng = DecodeEngine(model, batch=3, max_len=ids.shape[1] + 24, bucket=16)
    torch.manual_seed(5)
    out = eng.generate(ids, attn, max_new_tokens=24, temperature=1.0, force_length=True)
    _, ent = _check_against_forward(model, ids, attn, out)
    assert torch.allclose(out.entropy, ent, atol=1e-4)
    torch.manual_seed(5)
    again = eng.generate(ids, attn, max_new_tokens=24, temperature=1.0, force_length=True)
    assert torch.equal(again.tokens, out.tokens)  # the engine is reusable and seeded by the torch RNG
    assert len({tuple(r) for r in out.tokens.tolist()}) == 3


def test_top_p_and_temperature_distribution(setup):
    model, tok, ids, attn = setup
    eng = DecodeEngine(model, batch=3, max_len=ids.shape[1] + 6)
    torch.manual_seed(1)
    out = eng.generate(ids, attn, max_new_tokens=6, temperature=0.6, top_p=0.9, force_length=True)
    assert torch.isfinite(out.logp).all() and (out.logp <= 0).all()
    assert (out.entropy >= 0).all()


def test_eos_ends_rows(setup):
    model, tok, ids, attn = setup
    eng = DecodeEngine(model, batch=3, max_len=ids.shape[1] + 16, bucket=8)
    free = eng.generate(ids, attn, max_new_tokens=16, temperature=0.0, force_length=True)
    stop = int(free.tokens[0, 3])  # make row 0's 4th token an "EOS"
    out = eng.generate(ids, attn, max_new_tokens=16, temperature=0.0, eos_ids=[stop], check_every=4)
    first = [(r == stop).nonzero() for r in free.tokens]
    for i, f in enumerate(first):
        if len(f):
            assert out.finished[i] and out.lengths[i] == int(f[0]) + 1
        else:
            assert not out.finished[i] and out.lengths[i] == out.tokens.shape[1]
    assert int(out.lengths[0]) <= 4


def test_capture_covers_every_bucket_and_keeps_results(setup):
    model, tok, ids, attn = setup
    eng = DecodeEngine(model, batch=3, max_len=ids.shape[1] + 20, bucket=8, graphs=False)
    ref = eng.generate(ids, attn, max_new_tokens=20, temperature=0.0, force_length=True)
    eng.capture(ids.shape[1], 20)  # eager here: exercises the same slots as graph capture on CUDA
    spans = eng.spans(ids.shape[1], 20)  # the 19 decode steps, by the bucket they attend over
    assert sum(spans.values()) == 19 and all(s % 8 == 0 or s == eng.max_len for s in spans)
    assert min(spans) >= ids.shape[1] + 1 and max(spans) == min(eng.max_len, -(-(ids.shape[1] + 19) // 8) * 8)
    out = eng.generate(ids, attn, max_new_tokens=20, temperature=0.0, force_length=True)
    assert torch.equal(out.tokens, ref.tokens) and torch.allclose(out.logp, ref.logp)


def test_rejects_bad_shapes(setup):
    model, tok, ids, attn = setup
    eng = DecodeEngine(model, batch=3, max_len=ids.shape[1] + 4)
    with pytest.raises(ValueError, match="max_len"):
        eng.generate(ids, attn, max_new_tokens=5)
    with pytest.raises(ValueError, match="batch 3"):
        eng.prefill(ids[:2], attn[:2])
    with pytest.raises(ValueError, match="Qwen2/Llama"):
        DecodeEngine(torch.nn.Linear(2, 2), batch=1, max_len=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and grouped kernels need a GPU")
@pytest.mark.parametrize("method", ["lora", "qerl", "qlora"])
def test_cuda_graphs_and_grouping_match_eager(method):
    if method == "qlora":
        pytest.importorskip("bitsandbytes")
    from qerl.profiling.build import build_random_model
    model = build_random_model("0.5B", method, rank=8, layers=2, device="cuda")
    ids = torch.randint(0, 1000, (2, 40), device="cuda")
    attn = torch.ones_like(ids)
    attn[1, :7] = 0
    eager = DecodeEngine(model, batch=2, max_len=72, bucket=16, graphs=False, fuse=False)
    fast = DecodeEngine(model, batch=2, max_len=72, bucket=16, graphs=True, fuse=True)
    a = eager.generate(ids, attn, max_new_tokens=32, temperature=0.0, force_length=True)
    b = fast.generate(ids, attn, max_new_tokens=32, temperature=0.0, force_length=True)
    assert len(fast._graphs) == 3
    kinds = fast.group_kinds()
    assert kinds == {"qlora": {"bases"}, "lora": {"dense"}, "qerl": {"fp4"}}[method], kinds
    assert eager.group_kinds() == {"call"} and fast.use_triton and not eager.use_triton
    if method == "qerl":  # q/k/v and gate/up: one contiguous group over the layers' own buffers (no copy)
        for g in (fast._groups[0][0], fast._groups[0][2]):
            assert isinstance(g.w, PreparedFP4) and len(g.w.parts) == len(g.members) > 1
            assert {p.words.untyped_storage().data_ptr() for p in g.members} == {g.w.words.untyped_storage().data_ptr()}
    # random weights give near-flat distributions, so greedy paths part at the first near-tie (the fused kernels
    # round differently from the module calls): both must sample what the model computes, teacher-forced
    assert torch.equal(a.tokens[:, 0], b.tokens[:, 0]), (a.tokens[:, :4], b.tokens[:, :4])
    for out in (a, b):
        full = torch.cat([ids, out.tokens], 1)
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, full, torch.cat([attn, torch.ones_like(out.tokens)], 1), ids.shape[1])
        err = (logp - out.logp).abs()
        assert err.mean() < 0.02 and err.max() < 0.15, (err.mean(), err.max(), (a.tokens == b.tokens).float().mean())


def test_sample_through_the_engine_matches_the_eager_loop(setup):
    """Greedy decoding: the same texts, lengths, EOS/stop-string ends and masks through both paths of `sample`."""
    from qerl.rl.rollout import sample
    model, tok, _, _ = setup
    prompts = [build_prompt(q, tok, "none") for q in QUESTIONS]
    kw = dict(group_size=2, max_new_tokens=40, temperature=0.0)
    free = sample(model, tok, prompts, engine=False, stop_strings=(), **kw)
    assert len(free.texts[0]) > 8
    for stops in (("</answer>",), (free.texts[0][4:7],)):  # the second: row 0 surely hits it mid-completion
        a = sample(model, tok, prompts, engine=False, stop_strings=stops, **kw)
        b = sample(model, tok, prompts, engine=True, stop_strings=stops, **kw)
        assert a.texts == b.texts
        assert torch.equal(a.lengths, b.lengths) and torch.equal(a.truncated, b.truncated)
        assert b.prompt_len % 64 == 0
        ca = a.input_ids[:, a.prompt_len:][a.completion_mask[:, a.prompt_len:].bool()]
        cb = b.input_ids[:, b.prompt_len:][b.completion_mask[:, b.prompt_len:].bool()]
        assert torch.equal(ca, cb)
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, b.input_ids, b.attention_mask, b.prompt_len)
        m = b.completion_mask[:, b.prompt_len:].bool()
        assert torch.allclose(logp[m], b.sample_logp[m], atol=1e-4)
    assert (a.truncated == False).any()  # noqa: E712 - some rows ended by the stop string


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA path of sample() (graphs) needs a GPU")
def test_sample_on_cuda_uses_the_engine_and_agrees_with_the_eager_loop(setup):
    from qerl.rl.rollout import sample
    model, tok, _, _ = setup
    model = _lora(model).cuda()
    prompts = [build_prompt(q, tok, "none") for q in QUESTIONS]
    kw = dict(group_size=2, max_new_tokens=40, temperature=0.0)
    a = sample(model, tok, prompts, engine=False, **kw)
    keys = set(model.__dict__)
    b = sample(model, tok, prompts, **kw)  # auto: CUDA -> the engine, with graphs
    from qerl.rl import rollout
    assert rollout._ENGINES[model].graphs and set(model.__dict__) == keys  # kept beside the model, not in it
    assert sum(x == y for x, y in zip(a.texts, b.texts)) >= len(a.texts) - 1  # fp32 on GPU: near-ties may flip
    c = sample(model, tok, prompts, generator=torch.Generator(device="cuda").manual_seed(3), group_size=2,
               max_new_tokens=40, temperature=1.0)
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, c.input_ids, c.attention_mask, c.prompt_len)
    m = c.completion_mask[:, c.prompt_len:].bool()
    assert (logp[m] - c.sample_logp.to(logp.device)[m]).abs().max() < 1e-2


@pytest.mark.parametrize("engine", [False, True])
def test_chunked_sampling_joins_into_one_consistent_batch(setup, engine):
    from qerl.rl.rollout import sample
    model, tok, _, _ = setup
    prompts = [build_prompt(q, tok, "none") for q in QUESTIONS]
    kw = dict(group_size=2, max_new_tokens=24, temperature=0.0, engine=engine)
    whole = sample(model, tok, prompts, **kw)
    parts = sample(model, tok, prompts, max_rows=5, **kw)  # 5 rows -> chunks of 2 prompts and 1 prompt
    assert parts.texts == whole.texts
    assert torch.equal(parts.lengths, whole.lengths) and torch.equal(parts.truncated, whole.truncated)
    assert parts.input_ids.shape[0] == 6 and parts.completion_mask.sum() == whole.completion_mask.sum()
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, parts.input_ids, parts.attention_mask, parts.prompt_len)
    m = parts.completion_mask[:, parts.prompt_len:].bool()
    assert torch.allclose(logp[m], parts.sample_logp[m], atol=1e-4)
    assert (parts.sample_logp[~m] == 0).all() and (parts.entropy[~m] == 0).all()


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _kernel_model(variant: str):
    """A tiny model wide enough for the decode kernels (head_dim 32), in `variant` ("plain", "lora", "nvfp4+lora"),
    on the GPU if there is one, with two left-padded prompts: (model, ids, attention mask)."""
    torch.manual_seed(0)
    tok = build_tokenizer()
    model = build_model(tok, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, seed=3).eval()
    if "nvfp4" in variant:
        model = _nvfp4(model)
    if "lora" in variant:
        model = _lora(model)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(dev)
    enc = tok([build_prompt(q, tok, "none") for q in QUESTIONS[:2]], return_tensors="pt", padding=True,
              padding_side="left", add_special_tokens=False)
    return model, enc["input_ids"].to(dev), enc["attention_mask"].to(dev)


@pytest.mark.triton_device
@pytest.mark.parametrize("variant,batch", [("plain", 2), ("lora", 2), ("nvfp4+lora", 2), ("nvfp4+lora", 1),
                                           ("lora", 1)],
                         ids=["plain", "lora", "nvfp4+lora", "nvfp4+lora-batch1", "lora-batch1"])
def test_triton_decode_kernels_match_the_torch_step(variant, batch):
    """The fused decode kernels (qerl_kernels.decode; Triton's interpreter on CPU) inside the engine give the torch
    references' tokens and log-probs, and the teacher-forced forward's log-probs (at batch 1 with the LoRA
    down-products of the split kernel: qerl_kernels.decode.LORA_SPLIT_MAX_ROWS; down's fused with the activation,
    silu_mul_lora)."""
    _triton_matches_torch(variant, batch)


def test_triton_decode_step_with_the_split_lora_kernels_at_two_rows(monkeypatch):
    """The same at batch 2 with every group's LoRA down-products by the split kernel (QERL_LORA_SPLIT_ROWS: the
    multi-row norm of rmsnorm_lora, silu_mul_lora and lora_down at the rows where LORA_SPLIT_MAX_ROWS may put them)."""
    import qerl.rl.engine as engine_mod
    rows = []
    for name in ("rmsnorm_lora", "silu_mul_lora"):
        real = getattr(engine_mod, name)

        def spy(h, *args, _real=real, **kw):
            if kw.get("use_triton"):
                rows.append(h.numel() // h.shape[-1])
            return _real(h, *args, **kw)
        monkeypatch.setattr(engine_mod, name, spy)
    monkeypatch.setenv("QERL_LORA_SPLIT_ROWS", "q/k/v=2,o=2,gate/up=2,down=2")
    _triton_matches_torch("nvfp4+lora", 2)
    assert 2 in rows


@pytest.mark.triton_device
@pytest.mark.parametrize("variant,batch", [("nvfp4+lora", 1), ("lora", 2)], ids=["nvfp4+lora-batch1", "lora"])
def test_triton_decode_step_with_split_attention_matches_the_torch_step(variant, batch, monkeypatch):
    """The same with the attention split over the keys (the 7B step's shape: a combine kernel, which computes o's
    LoRA down-products as well; the tiny model's short spans otherwise take one split)."""
    from qerl_kernels import decode
    calls = []
    real = decode.decode_attention

    def spy(*args, **kw):
        out = real(*args, **kw)
        if kw.get("use_triton"):
            calls.append(kw.get("lora_a") is not None and out[1] is not None)
        return out
    monkeypatch.setattr(decode, "attention_splits", lambda *a, **k: 2)
    monkeypatch.setattr("qerl.rl.engine.decode_attention", spy)
    _triton_matches_torch(variant, batch)
    assert calls and all(calls)  # every Triton step's combine gave o's t


def _triton_matches_torch(variant, batch):
    model, ids, attn = _kernel_model(variant)
    ids, attn = ids[:batch], attn[:batch]
    ref = DecodeEngine(model, batch=batch, max_len=ids.shape[1] + 10, bucket=8, kernels="torch", graphs=False)
    tri = DecodeEngine(model, batch=batch, max_len=ids.shape[1] + 10, bucket=8, kernels="triton", graphs=False)
    assert tri.use_triton and not ref.use_triton
    a = ref.generate(ids, attn, max_new_tokens=10, temperature=0.0, force_length=True)
    b = tri.generate(ids, attn, max_new_tokens=10, temperature=0.0, force_length=True)
    assert torch.equal(a.tokens, b.tokens)
    assert torch.allclose(a.logp, b.logp, atol=1e-4)
    _check_against_forward(model, ids, attn, b)


def test_engine_leaves_the_model_untouched(setup):
    """No buffers rewritten, no weights rebound, nothing kept in the model's __dict__ (CPU: nothing converted)."""
    model, tok, ids, attn = setup
    model = _lora(_nvfp4(model))
    before = _state(model)
    ptrs = {n: t.data_ptr() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    keys = {n: set(m.__dict__) | set(m._buffers) for n, m in model.named_modules()}
    eng = DecodeEngine(model, batch=3, max_len=ids.shape[1] + 6)
    eng.generate(ids, attn, max_new_tokens=6, temperature=1.0, force_length=True)
    after = _state(model)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert ptrs == {n: t.data_ptr() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    assert keys == {n: set(m.__dict__) | set(m._buffers) for n, m in model.named_modules()}


def test_engine_does_not_import_the_sampler():
    """One direction only: rollout uses the engine; the engine shares qerl.rl.sampling, not rollout."""
    import subprocess
    import sys
    code = "import sys, qerl.rl.engine; assert 'qerl.rl.rollout' not in sys.modules, 'engine imports rollout'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _aqn_runs(model, ids, attn, eng, steps=16):
    from qerl.noise import applied
    clean = eng.generate(ids, attn, max_new_tokens=steps, temperature=0.0, force_length=True)
    with applied(model, 0.05, torch.Generator().manual_seed(0)):
        noisy = eng.generate(ids, attn, max_new_tokens=steps, temperature=0.0, force_length=True)
    again = eng.generate(ids, attn, max_new_tokens=steps, temperature=0.0, force_length=True)
    return clean, noisy, again


def test_aqn_noise_changes_the_engines_tokens_and_restores_exactly(setup):
    """AQN writes noise into the RMSNorm weights in place: the engine (which reads them at each step) samples other
    tokens under noise, and after the exact restore the clean run is reproduced bit for bit."""
    model, tok, ids, attn = setup
    model = _lora(_nvfp4(model))
    eng = DecodeEngine(model, batch=3, max_len=ids.shape[1] + 16)
    clean, noisy, again = _aqn_runs(model, ids, attn, eng)
    assert (noisy.tokens != clean.tokens).float().mean() > 0.05  # 1/3 of the greedy tokens change here
    assert torch.equal(again.tokens, clean.tokens) and torch.equal(again.logp, clean.logp)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method", ["lora", "qerl"])
def test_aqn_noise_through_cuda_graphs(method):
    """The same on the GPU with captured graphs: noise is seen by the replays, the restored run matches exactly."""
    from qerl.profiling.build import build_random_model
    model = build_random_model("0.5B", method, rank=8, layers=2, device="cuda")
    ids = torch.randint(0, 1000, (4, 32), device="cuda")
    attn = torch.ones_like(ids)
    eng = DecodeEngine(model, batch=4, max_len=64, bucket=16)
    clean, noisy, again = _aqn_runs(model, ids, attn, eng, steps=24)
    assert eng._graphs and (noisy.tokens != clean.tokens).float().mean() > 0.05
    assert torch.equal(again.tokens, clean.tokens) and torch.equal(again.logp, clean.logp)


def test_fp4_weights_without_the_triton_kernels_replay_no_graphs(tiny_model):
    """float32 activations on 4-bit weights dequantize through the torch reference, which is not capturable (it
    made every NVFP4/MXFP4 evaluation in float32 fail on an H100): such an engine runs eagerly."""
    import copy

    from qerl.policy.formats import quantize_model
    from qerl.rl.engine import DecodeEngine

    model = quantize_model(copy.deepcopy(tiny_model), "nvfp4")
    eng = DecodeEngine(model, batch=2, max_len=32, graphs=True)
    assert "fp4" in eng.group_kinds() and not eng.use_triton
    assert eng.graphs is False


def test_prefill_in_row_chunks_equals_one_chunk(tiny_model, monkeypatch):
    """The prefill's attention runs in row chunks bounded by PREFILL_SCORES_BYTES; the logits do not change."""
    import qerl.rl.engine as E

    ids = torch.randint(3, tiny_model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a left-padded prompt
    whole = E.DecodeEngine(tiny_model, batch=3, max_len=16, graphs=False).prefill(ids, mask)
    cfg = tiny_model.config
    per_row = cfg.num_attention_heads * ids.shape[1] ** 2 * 4  # float32 scores of one row
    for budget in (1, 2 * per_row):  # chunks of 1 row, and of 2 rows with a last chunk of 1 (run 11 broke on that)
        monkeypatch.setattr(E, "PREFILL_SCORES_BYTES", budget)
        chunked = E.DecodeEngine(tiny_model, batch=3, max_len=16, graphs=False).prefill(ids, mask)
        torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["dense", "lora", "nvfp4"])
def test_prefill_layer_stack_in_row_chunks_equals_one_pass(setup, monkeypatch, variant):
    """A batch whose float32 MLP tensors would pass PREFILL_MLP_BYTES runs the whole layer stack in row chunks, each
    writing its own rows of the KV cache: logits, cache and the greedy completions equal one pass (3 rows in chunks
    of 1; left padding, a LoRA adapter, 4-bit weights)."""
    import qerl.rl.engine as E

    model, _, ids, attn = setup
    model = {"dense": model, "lora": _lora(model), "nvfp4": _nvfp4(model)}[variant]
    plen = ids.shape[1]

    def run():
        eng = E.DecodeEngine(model, batch=3, max_len=plen + 12, graphs=False)
        logits = eng.prefill(ids, attn).clone()
        cache = (eng.k_cache[:, :, :, :plen].clone(), eng.v_cache[:, :, :, :plen].clone())
        out = eng.generate(ids, attn, max_new_tokens=12, temperature=0.0)
        return logits, cache, out.tokens

    whole = run()
    assert E.PREFILL_MLP_BYTES // (plen * model.config.intermediate_size * 4) >= 3  # the default: one pass here
    monkeypatch.setattr(E, "PREFILL_MLP_BYTES", 1)  # one row a chunk
    chunked = run()
    torch.testing.assert_close(chunked[0], whole[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(chunked[1], whole[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert torch.equal(chunked[2], whole[2])


def test_prefill_holds_no_per_head_mask(tiny_model, monkeypatch):
    """The prefill's largest single allocation stays below the [rows x heads, T, T] mask that H100 run 11 ran out of
    memory on (the causal/padding mask materialised for every head): one boolean [B, T, T] mask filled into each
    chunk's scores instead. CPU allocations are read with torch's profiler."""
    import qerl.rl.engine as E
    from torch.profiler import ProfilerActivity, profile

    cfg = tiny_model.config
    bsz, t = 4, 128
    per_row = cfg.num_attention_heads * t * t * 4  # float32 scores of one row: the chunk size set here
    per_head_mask = bsz * per_row
    assert bsz * t * cfg.intermediate_size * 4 < per_head_mask / 2  # the MLP's tensors are not what is measured
    monkeypatch.setattr(E, "PREFILL_SCORES_BYTES", per_row)
    ids = torch.randint(3, cfg.vocab_size, (bsz, t), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :40] = 0
    eng = E.DecodeEngine(tiny_model, batch=bsz, max_len=t + 8, graphs=False)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        eng.prefill(ids, mask)
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert 0 < largest < per_head_mask / 2, (largest, per_head_mask)


def test_nf4_layers_marked_for_a_dequantized_decode_give_the_products_bitsandbytes_gives(setup):
    """config model.nf4_decode: dequantized: the engine runs QLoRA's NF4 bases from its own dequantized copy (one
    GEMM per projection group) and samples what it samples through bitsandbytes' layers, and what the model computes
    teacher-forced (through bitsandbytes); the model's own layers are untouched."""
    import copy

    from baselines.nf4 import bitsandbytes_cpu_problem, keep_trainable_layout, mark_decode_dequantized, quantize_nf4_
    problem = bitsandbytes_cpu_problem()
    if problem:
        pytest.skip(problem)
    model, tok, ids, attn = setup
    qlora = _lora(keep_trainable_layout(quantize_nf4_(copy.deepcopy(model))).eval())
    kw = dict(max_new_tokens=12, temperature=0.0, force_length=True)
    plain = DecodeEngine(qlora, batch=3, max_len=ids.shape[1] + 12)
    assert plain.group_kinds() == {"bases"}
    a = plain.generate(ids, attn, **kw)
    before = {n: p.detach().clone() for n, p in qlora.named_parameters()}
    assert mark_decode_dequantized(qlora) == 7 * len(model.model.layers)
    deq = DecodeEngine(qlora, batch=3, max_len=ids.shape[1] + 12)
    assert deq.group_kinds() == {"dense"}
    assert all(g.dequantized for groups in deq._groups for g in groups)
    b = deq.generate(ids, attn, **kw)
    assert torch.equal(a.tokens, b.tokens)
    assert torch.allclose(a.logp, b.logp, atol=1e-5), (a.logp - b.logp).abs().max()
    _check_against_forward(qlora, ids, attn, b)
    assert all(torch.equal(p, before[n]) for n, p in qlora.named_parameters())


def test_build_policy_marks_nf4_layers_only_when_the_config_asks(tiny_base):
    from baselines.nf4 import DECODE_DEQUANTIZED, bitsandbytes_cpu_problem
    from qerl.policy import build_policy
    problem = bitsandbytes_cpu_problem()
    if problem:
        pytest.skip(problem)

    def marked(policy):
        return sum(bool(getattr(m, DECODE_DEQUANTIZED, False)) for m in policy.model.modules())

    assert marked(build_policy("nf4", tiny_base)) == 0
    n_layers = len(build_policy("bf16", tiny_base).model.model.layers)
    assert marked(build_policy("qlora", tiny_base, nf4_decode="dequantized")) == 7 * n_layers
    assert marked(build_policy("lora", tiny_base, nf4_decode="dequantized")) == 0  # BF16 weights: nothing to mark
    with pytest.raises(ValueError, match="model.nf4_decode"):
        build_policy("nf4", tiny_base, nf4_decode="dequantised")


@pytest.mark.triton_device
def test_fused_sampler_records_what_the_model_gives_its_tokens():
    """Rollout sampling (temperature > 0, no top-p) through the Triton kernels draws with the fused sampler: the
    recorded log-probs are the teacher-forced forward's for the drawn tokens, a reseeded run draws the same tokens,
    and top-p sampling keeps torch's path."""
    import qerl.rl.engine as engine_mod
    model, ids, attn = _kernel_model("lora")
    eng = DecodeEngine(model, batch=2, max_len=ids.shape[1] + 5, bucket=8, kernels="triton", graphs=False)
    calls = []
    fused = engine_mod.sample_gumbel
    engine_mod.sample_gumbel = lambda *a: calls.append(1) or fused(*a)
    try:
        torch.manual_seed(5)
        a = eng.generate(ids, attn, max_new_tokens=5, temperature=1.0, force_length=True)
        assert len(calls) == 4  # every decode step (the first token comes from the prefill's logits)
        torch.manual_seed(5)
        b = eng.generate(ids, attn, max_new_tokens=5, temperature=1.0, force_length=True)
        eng.generate(ids, attn, max_new_tokens=5, temperature=1.0, top_p=0.9, force_length=True)
        assert len(calls) == 8
    finally:
        engine_mod.sample_gumbel = fused
    assert torch.equal(a.tokens, b.tokens)
    _check_against_forward(model, ids, attn, a)
    full = torch.cat([ids, a.tokens], 1)
    with torch.no_grad():
        _, ent = sequence_logprobs(model, full, torch.cat([attn, torch.ones_like(a.tokens)], 1), ids.shape[1],
                                   with_entropy=True)
    assert torch.allclose(a.entropy, ent, atol=1e-3)
