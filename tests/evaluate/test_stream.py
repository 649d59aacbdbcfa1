"""Continuous batching on the decode engine (qerl.evaluate.stream), on the CPU: a row continued in a later batch
gives the tokens it would have in one go (greedy), ends where plain batching ends it (EOS, stop string, length),
and the same generator gives the same samples."""
from __future__ import annotations

import pytest
import torch

from qerl.data.prompts import build_prompt
from qerl.evaluate import stream
from qerl.rl import rollout

QUESTIONS = ["Ann has 3 apples . Ann buys 5 apples . How many apples does Ann have now ?",
             "Ben has 9 pens . How many pens does Ben have now ?",
             "Cat has 2 cats . Cat buys 7 cats . Cat sells 1 cat . How many cats does Cat have now ?",
             "Dan has 4 cups .", "Eve has 12 hats . Eve gives 3 hats away . How many hats are left ?",
             "Fay has 1 dog . How many dogs ?", "Gus has 8 eggs . Gus eats 2 eggs . Gus buys 6 eggs . How many ?"]


@pytest.fixture()
def prompts(tokenizer):
    return [build_prompt(q, tokenizer) for q in QUESTIONS]


@pytest.fixture()
def varied_model(tokenizer):
    """A tiny model whose greedy rows differ (the untrained one repeats one token): random base + non-zero LoRA."""
    from qerl.models.tiny import build_model
    from tests.rl.test_engine import _lora

    return _lora(build_model(tokenizer, seed=1).eval())


def _plain_greedy(model, tokenizer, prompts, max_new):
    """Each prompt alone through the engine, greedy: (ids up to and including the end, finish)."""
    out = []
    for p in prompts:
        b = rollout.sample(model, tokenizer, [p], group_size=1, max_new_tokens=max_new, temperature=0.0,
                           stop_strings=(), engine=True)
        n = int(b.lengths[0])
        ids = b.input_ids[0, b.prompt_len:b.prompt_len + n].tolist()
        out.append((ids, "length" if bool(b.truncated[0]) else "eos"))
    return out


def test_greedy_rows_continued_across_batches_equal_one_pass(tokenizer, varied_model, prompts, monkeypatch):
    max_new = 80
    first = _plain_greedy(varied_model, tokenizer, prompts, max_new)
    # a token the greedy rows reach at different steps serves as EOS, so rows end at different times and batches refill
    counts = {}
    for ids, _ in first:
        for k, tok in enumerate(ids):
            counts.setdefault(tok, set()).add(k)
    tok = max((t for t in counts if 3 < min(counts[t]) < max_new - 8), key=lambda t: len(counts[t]), default=None)
    assert tok is not None
    monkeypatch.setattr(rollout, "eos_token_ids", lambda model, tokenizer: {tok})
    plain = _plain_greedy(varied_model, tokenizer, prompts, max_new)
    assert {f for _, f in plain} == {"eos", "length"} or len({len(i) for i, _ in plain}) > 1
    calls = []
    real = rollout.engine_for

    batches = []

    def spy(model, batch, max_len):
        eng = real(model, batch, max_len)
        calls.append(eng)
        if not hasattr(eng.generate, "spied"):
            gen = eng.generate

            def counted(*a, **k):
                batches.append(k.get("min_active"))
                return gen(*a, **k)

            counted.spied = True
            eng.generate = counted
        return eng

    monkeypatch.setattr(rollout, "engine_for", spy)
    got = stream.sample_stream(varied_model, tokenizer, prompts, max_new_tokens=max_new, temperature=0.0, top_p=1.0,
                               stop=(), generator=None, batch_size=3, refill_below=1.0)
    assert got == plain
    assert len({id(e) for e in calls}) == 1  # one engine (one set of graphs) for the whole evaluation
    assert len(batches) > 3  # 7 prompts in rows of 3: rows were refilled and continued, not 3 plain batches


def test_same_generator_same_samples_and_lengths(tokenizer, varied_model, prompts):
    def run(seed):
        return stream.sample_stream(varied_model, tokenizer, prompts, max_new_tokens=40, temperature=1.0, top_p=0.95,
                                    stop=("</answer>",), generator=torch.Generator().manual_seed(seed), batch_size=4)

    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    for ids, finish in a:
        assert finish in ("eos", "stop", "length")
        assert (len(ids) == 40) == (finish == "length") and 1 <= len(ids) <= 40


def test_row_end(tokenizer):
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    stop = ("</answer>",)
    cands = set(rollout._stop_candidates(tokenizer, stop).tolist())
    eos = {tokenizer.eos_token_id}
    body = enc("<answer> 8 </answer> more")
    n_stop = len(enc("<answer> 8 </answer>"))
    assert stream.row_end([], body, eos, cands, tokenizer, stop) == (n_stop, "stop")
    # the stop string split over two batches: found in the second
    assert stream.row_end(body[:n_stop - 1], body[n_stop - 1:], eos, cands, tokenizer, stop) == (1, "stop")
    # an EOS before the stop string ends the row there; none of either: it goes on
    assert stream.row_end([], enc("<answer> 8") + [tokenizer.eos_token_id] + enc("</answer>"), eos, cands,
                          tokenizer, stop) == (len(enc("<answer> 8")) + 1, "eos")
    assert stream.row_end([], enc("<answer> 8"), eos, cands, tokenizer, stop) is None
    assert stream.row_end([], body, eos, cands, tokenizer, ()) is None


def test_eval_batching_benchmark_runs(tokenizer, varied_model, tmp_path, shared_data_root):
    """qerl.profiling.eval_batching end to end on the CPU: both modes, the same problems, a whole report."""
    import json

    from qerl.profiling import eval_batching

    varied_model.merge_and_unload().save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    out = tmp_path / "r.json"
    assert eval_batching.main(["--model", str(tmp_path / "m"), "--data", str(shared_data_root), "--limit", "6",
                               "--batch", "4", "--max-new", "40", "--device", "cpu", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert [r["mode"] for r in rep["results"]] == ["fixed batches", "continuous 0.25"]
    assert all(sum(r["finish"].values()) == 6 == rep["n_problems"] for r in rep["results"])


def test_generation_budget_past_the_positions_is_an_error(tokenizer, varied_model, prompts):
    with pytest.raises(ValueError, match="max_position_embeddings = 320"):
        stream.sample_stream(varied_model, tokenizer, prompts, max_new_tokens=320, temperature=0.0, top_p=1.0,
                             stop=(), generator=None, batch_size=4)
