"""The sampler and the lm-eval LM: stop strings kept, EOS, length limit, seeds, top-p, greedy = argmax, batching."""
from __future__ import annotations

import pytest
import torch

from qerl.data.prompts import build_prompt
from qerl.evaluate.lm import QerlLM, sample
from qerl.rl.sampling import top_p_filter

PROMPT_Q = "Ann has 3 apples . Ann buys 5 apples . How many apples does Ann have now ?"


def _prompts(tokenizer, n=1):
    return [build_prompt(PROMPT_Q, tokenizer)] * n


def test_stop_string_is_kept_and_ends_the_completion(tokenizer, scripted):
    model = scripted("<think> 3 + 5 = 8 </think> <answer> 8 </answer> ignored tokens after the stop")
    [c] = sample(model, tokenizer, _prompts(tokenizer), max_new_tokens=40, temperature=0.6, top_p=0.95)
    assert c.finish == "stop"
    assert c.text.endswith("</answer>") and "ignored" not in c.text
    assert c.text == "<think> 3 + 5 = 8 </think> <answer> 8 </answer>"


def test_eos_ends_without_being_in_the_text_and_length_limit(tokenizer, scripted):
    model = scripted("<think> 3 </think>")
    [c] = sample(model, tokenizer, _prompts(tokenizer), max_new_tokens=40, stop=("</answer>",))
    assert (c.finish, c.text) == ("eos", "<think> 3 </think>")
    assert c.n_tokens == len(tokenizer("<think> 3 </think>", add_special_tokens=False)["input_ids"]) + 1
    [c] = sample(model, tokenizer, _prompts(tokenizer), max_new_tokens=2)
    assert (c.finish, c.n_tokens) == ("length", 2)


def test_seeded_generator_reproduces_and_does_not_touch_global_rng(tokenizer, tiny_model):
    prompts = _prompts(tokenizer, 6)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = sample(tiny_model, tokenizer, prompts, max_new_tokens=12, generator=torch.Generator().manual_seed(5),
               batch_size=4)
    after = torch.rand(1)
    b = sample(tiny_model, tokenizer, prompts, max_new_tokens=12, generator=torch.Generator().manual_seed(5),
               batch_size=4)
    c = sample(tiny_model, tokenizer, prompts, max_new_tokens=12, generator=torch.Generator().manual_seed(6),
               batch_size=4)
    assert a == b
    assert a != c
    assert torch.equal(before, after)  # the global RNG was not consumed
    assert len({x.text for x in a}) > 1  # six samples of one prompt are not all the same


def test_greedy_matches_a_plain_argmax_loop(tokenizer, tiny_model):
    """The KV-cached, left-padded batch gives the same greedy tokens as a cache-free loop per prompt."""
    prompts = [build_prompt(PROMPT_Q, tokenizer), build_prompt("Ben has 9 pens . How many pens does Ben have now ?",
                                                               tokenizer)]
    outs = sample(tiny_model, tokenizer, prompts, max_new_tokens=10, temperature=0.0, stop=(), batch_size=2)
    for prompt, out in zip(prompts, outs):
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        new = []
        with torch.no_grad():
            for _ in range(10):
                nxt = int(tiny_model(input_ids=ids).logits[0, -1].argmax())
                new.append(nxt)
                if nxt == tokenizer.eos_token_id:
                    break
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        expected = tokenizer.decode(new[:-1] if new[-1] == tokenizer.eos_token_id else new, skip_special_tokens=True)
        assert out.text == expected


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)

    def draw(top_p):
        return int(torch.multinomial(torch.softmax(top_p_filter(logits, top_p), -1), 1, generator=g))

    assert {draw(0.7) for _ in range(300)} == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3: tokens 0 and 1 only
    assert {draw(0.1) for _ in range(50)} == {0}  # the most likely token always survives
    assert {draw(1.0) for _ in range(600)} == {0, 1, 2, 3}


def test_bad_settings_and_too_long_generation_rejected(tokenizer, tiny_model):
    with pytest.raises(ValueError, match="evaluate.top_p"):
        sample(tiny_model, tokenizer, _prompts(tokenizer), max_new_tokens=4, top_p=0.0)
    with pytest.raises(ValueError, match="evaluate.max_new_tokens"):
        sample(tiny_model, tokenizer, _prompts(tokenizer), max_new_tokens=0)
    with pytest.raises(ValueError, match="max_position_embeddings = 320"):
        sample(tiny_model, tokenizer, _prompts(tokenizer), max_new_tokens=400)


def test_lm_eval_model_batches_requests_in_order_and_refuses_loglikelihood(tokenizer, scripted):
    from lm_eval.api.instance import Instance

    model = scripted("<answer> 8 </answer>")
    kwargs = {"until": ["</answer>"], "do_sample": True, "temperature": 0.6, "top_p": 0.95, "max_gen_toks": 10}
    reqs = [Instance("generate_until", {}, (p, dict(kwargs)), i) for i, p in enumerate(_prompts(tokenizer, 3))]
    lm = QerlLM(model, tokenizer, generator=torch.Generator().manual_seed(0), batch_size=2)
    assert lm.generate_until(reqs) == ["<answer> 8 </answer>"] * 3
    assert [c.finish for _, c in lm.log] == ["stop"] * 3
    bad = [Instance("generate_until", {}, (reqs[0].args[0], {"until": [], "num_beams": 4}), 0)]
    with pytest.raises(ValueError, match="num_beams"):
        lm.generate_until(bad)
    with pytest.raises(NotImplementedError):
        lm.loglikelihood(reqs)


def test_a_training_model_with_gradient_checkpointing_samples_with_its_cache(tokenizer, tiny_model):
    """The trainer's policy is in train mode with checkpointing on (which turns the KV cache off): sample() switches
    to eval mode for the call, so the completions equal those of the same model in eval mode, and restores it."""
    prompts = _prompts(tokenizer, 2)
    expected = sample(tiny_model, tokenizer, prompts, max_new_tokens=8, generator=torch.Generator().manual_seed(1))
    tiny_model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    tiny_model.train()
    got = sample(tiny_model, tokenizer, prompts, max_new_tokens=8, generator=torch.Generator().manual_seed(1))
    assert got == expected and tiny_model.training
