"""The measurement script's pieces: perplexities agree with transformers' own loss; measure() reports every row."""
from __future__ import annotations

import json
import math

import torch

from qerl.quantize.measure import completion_perplexity, main, measure, perplexity


def tiny_qwen2(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).eval()


def test_perplexities_match_the_model_loss():
    model = tiny_qwen2()
    ids = torch.randint(0, 96, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert math.isclose(perplexity(model, ids, batch_size=2), math.exp(loss), rel_tol=1e-4)
    # completion-only: prompt positions masked out, right padding ignored
    seqs = [(ids[0].tolist(), 8), (ids[1, :15].tolist(), 5)]
    labels = []
    for seq, n in seqs:
        lab = torch.tensor(seq)
        lab[:n] = -100
        labels.append(lab)
    with torch.no_grad():
        nll = sum(model(input_ids=torch.tensor([s]), labels=lab[None]).loss.item() * (len(s) - n)
                  for (s, n), lab in zip(seqs, labels))
    count = sum(len(s) - n for s, n in seqs)
    assert math.isclose(completion_perplexity(model, seqs, batch_size=2), math.exp(nll / count), rel_tol=1e-4)


def test_measure_reports_every_row():
    model = tiny_qwen2()
    gen = torch.Generator().manual_seed(1)
    calib, held = torch.randint(0, 96, (4, 16), generator=gen), torch.randint(0, 96, (4, 16), generator=gen)
    out = measure(model, calib, held, formats=("nvfp4", "mxfp4"), grid=2, nf4=False,
                  examples=[(held[0].tolist(), 4)], log=lambda m: None)
    assert set(out["perplexity"]) == {"unquantized", "nvfp4_rtn", "nvfp4_awq", "mxfp4_rtn", "mxfp4_awq"}
    assert all(set(v) == {"text", "completion"} for v in out["perplexity"].values())
    for fmt in ("nvfp4", "mxfp4"):
        e = out["layer_error"][fmt]
        assert len(e["rtn"]["per_layer"]) == 7 and 0 < e["rtn"]["mean"] < 0.5 and 0 <= e["awq_better_fraction"] <= 1
    json.dumps(out)  # JSON-able


def test_cli_writes_json(tmp_path):
    from qerl.data.tiny import generate_split
    from qerl.models.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    build_model(tok, hidden_size=64, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                max_position=64).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in generate_split(0, 40, [1, 2], "rl")))
    assert main(["--base", str(tmp_path / "m"), "--calib", str(data), "--heldout", str(data), "--n-calib", "2",
                 "--n-heldout", "2", "--seq-len", "32", "--grid", "2", "--formats", "nvfp4", "--no-nf4",
                 "--n-completion", "4", "--out", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["setup"]["n_completion"] == 4 and out["perplexity"]["nvfp4_awq"]["completion"] > 1
