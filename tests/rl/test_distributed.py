"""Data-parallel training equals one process on the same global batch: 2 gloo processes on CPU under torchrun.

The test launches this file as a script under `python -m torch.distributed.run --standalone --nproc_per_node 2`
(once, for every case, to pay the process start-up once) and compares what the ranks saved with the same work
done by one process here:
  * policy_update (qerl.rl.step) on a fixed global batch (GRPO with a KL term, DAPO's token normalisation; LoRA and full): the same
    global losses and the same weights after two optimizer steps;
  * the GPU benchmark (qerl.profiling.ddp: the trainer's rl_step on random weights) runs on the two ranks (a
    1-layer shape with Qwen2.5's vocabulary and narrow layers, DDP_ARCH, the tiny config's settings) and writes its
    CSV;
  * train() end to end (qerl = NVFP4 + AQN, GRPO with KL, two off-policy updates per step) with a rollout that is a
    function of the prompt alone (per-prompt seeded sampling) and rewards hashed from the text, so one and two
    processes see the same global batch: the same metrics and adapter, metrics.jsonl written once, and a killed
    two-process run resumes to the same result.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from qerl.config import validate_config
from qerl.contract.paths import rollout_chunks
from qerl.contract.records import read_rollouts
from qerl.data.tiny import write_splits
from qerl.models.tiny import build_model, build_tokenizer
from qerl.profiling import ddp
from qerl.profiling.archs import ARCHS, Arch
from qerl.rl import step as S
from qerl.rl import trainer as T
from qerl.rl.distributed import DistContext, claim_gpus, init_distributed, shard_range, shutdown
from qerl.rl.rollout import _concat, sample, sequence_logprobs
from qerl.rl.settings import build_run_policy, resolve_settings

WORLD = 2
B, G, PROMPT, COMPLETION = 4, 4, 6, 8  # the synthetic global batch of the policy_update cases
UPDATE_CASES = [("lora", "grpo"), ("lora", "dapo"), ("full", "dapo")]
PARTS_ROWS = 3  # train.update_max_rows of the accumulation cases: a minibatch of 8 rows in parts of 3, 3 and 2
TIMING = {"time_rollout", "time_logprobs", "time_update", "peak_memory_bytes", "rollout_tokens_per_s"}
REPO = Path(__file__).resolve().parents[2]
# The benchmark's smoke test checks what it writes, not speed: Qwen2.5-0.5B's vocabulary (and so its EOS odds) with
# 64-wide layers, registered under its own name in the ranks only; at 0.5B's widths (896, MLP 4864) one layer took
# ~11 of the ranks' ~16 s.
DDP_ARCH = Arch("test-narrow", hidden=64, intermediate=128, layers=1, heads=4, kv_heads=2, vocab=151936, tied=True)
CONFIG = {
    "prompt": {"instruction": "none"},
    "train": {"steps": 2, "prompts_per_step": 3, "checkpoint_every": 1, "lr": 1e-3, "lr_by_method": {},
              "kl_coef": 0.05, "lora": {"rank": 4, "alpha": 8}, "rollout_samples": {"every": 1, "share": 1.0},
              "aqn": {"stages": 2, "sigma_start": 0.05, "sigma_end": 0.01},
              "tasks": {"grpo": {"source": "tiny", "algorithm": "grpo", "group_size": G, "updates_per_rollout": 2,
                                 "max_new_tokens": 6},
                        "dapo": {"source": "tiny", "algorithm": "dapo", "group_size": G, "updates_per_rollout": 2,
                                 "max_new_tokens": 6, "overlong_filter": True}}},
}


# ---- shared by the ranks and the single-process reference ----------------------------------------------------------
def _global_batch(model, seed: int = 0) -> dict:
    """B prompts x G completions of random tokens: left-padded prompts, ragged completions, one empty row per
    group pair, old/ref log-probs near the policy's; the same tensors in every process (seeded, one thread)."""
    gen = torch.Generator().manual_seed(seed)
    n, vocab = B * G, model.config.vocab_size
    ids = torch.randint(3, vocab, (n, PROMPT + COMPLETION), generator=gen)  # [N, P + L]
    prompt_len = torch.randint(2, PROMPT + 1, (B,), generator=gen).repeat_interleave(G)  # [N]
    comp_len = torch.randint(0, COMPLETION + 1, (n,), generator=gen)  # [N] some rows have no valid token
    pos = torch.arange(PROMPT + COMPLETION)
    attn = ((pos >= PROMPT - prompt_len[:, None]) & (pos < PROMPT + comp_len[:, None])).long()  # [N, P + L]
    mask = (pos[PROMPT:] < comp_len[:, None]).float()  # [N, L]
    adv = torch.randn(n, generator=gen)  # [N]
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, ids, attn, PROMPT)  # [N, L]
    old = logp + 0.1 * torch.randn(logp.shape, generator=gen)
    ref = logp + 0.1 * torch.randn(logp.shape, generator=gen)
    return {"ids": ids, "attn": attn, "mask": mask, "adv": adv, "old": old, "ref": ref}


def _update_case(cfg: dict, root: Path, method: str, task: str, ctx: DistContext) -> dict:
    s = resolve_settings(cfg, task, method, "default", seed=0)
    torch.manual_seed(s.seed)
    learner = S.make_learner(build_run_policy(s, root / "base", dtype=cfg["model"]["dtype"]), s)
    model = learner.model
    g = _global_batch(model)
    lo, hi = shard_range(B, ctx.rank, ctx.world_size) if ctx.distributed else (0, B)
    rows = slice(lo * G, hi * G)
    batch = S.UpdateBatch(g["ids"][rows], g["attn"][rows], PROMPT, g["mask"][rows], g["adv"][rows], g["old"][rows],
                          g["ref"][rows] if s.kl_coef > 0 else None, row_offset=lo * G, global_rows=B * G)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    out = S.policy_update(learner, s, batch, step=0, ctx=ctx)
    after = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {"losses": out["losses"], "grad_norms": out["grad_norms"], "before": before, "after": after,
            "clip": [d["clip_fraction"] for d in out["diags"]], "kl": [d.get("kl") for d in out["diags"]]}


def _parts(cfg: dict) -> dict:
    """cfg with train.update_max_rows = PARTS_ROWS: each rank's rows of a minibatch in passes of at most that many."""
    out = json.loads(json.dumps(cfg))
    out["train"]["update_max_rows"] = PARTS_ROWS
    return out


def _per_prompt_sample(model, tokenizer, prompts, *, group_size, max_new_tokens, temperature, top_p, generator,
                       max_rows=None, engine=None):
    """The real sampler run prompt by prompt, seeded by the prompt text: a rollout independent of the sharding."""
    parts = [sample(model, tokenizer, [p], group_size=group_size, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_p=top_p, engine=engine,
                    generator=torch.Generator().manual_seed(zlib.crc32(p.encode()))) for p in prompts]
    return _concat(parts, tokenizer.pad_token_id)


def _hashed_rewards(texts, golds, format_weight=0.0):
    """Rewards that vary within groups (a random tiny model is never right), fixed by the completion text."""
    return [SimpleNamespace(reward=float(zlib.crc32(t.encode()) % 2), correct=zlib.crc32(t.encode()) % 3 == 0)
            for t in texts]


def _train(cfg: dict, root: Path, out: str, **kw) -> dict:
    s = resolve_settings(cfg, "grpo", "qerl", "default", seed=0)
    return T.train(cfg, s, root / "base", root / out, data_dir=root / "data", progress=False, **kw)


def _trainable(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _worker(root: Path) -> None:
    """One rank (run by torchrun): every case, results saved as <case>_rank<r>.pt under root."""
    torch.set_num_threads(1)
    ctx = init_distributed()
    assert ctx.distributed and ctx.world_size == WORLD and ctx.backend == "gloo", ctx
    cfg = json.loads((root / "cfg.json").read_text())
    for method, task in UPDATE_CASES:
        torch.save(_update_case(cfg, root, method, task, ctx), root / f"update_{method}_{task}_rank{ctx.rank}.pt")
        torch.save(_update_case(_parts(cfg), root, method, task, ctx),
                   root / f"parts_{method}_{task}_rank{ctx.rank}.pt")
    S.sample, S.compute_rewards = _per_prompt_sample, _hashed_rewards
    full = _train(cfg, root, "two")
    _train(cfg, root, "killed", stop_after=1)
    resumed = _train(cfg, root, "killed")
    torch.save({"full": _trainable(full["model"]), "resumed": _trainable(resumed["model"])},
               root / f"train_rank{ctx.rank}.pt")
    ARCHS[DDP_ARCH.name] = DDP_ARCH
    ddp.run(_ddp_args(root / "ddp"))  # the GPU benchmark's smoke test, on the same two ranks (it ends the group)
    shutdown(ctx)


def _ddp_args(out: Path):
    parser = argparse.ArgumentParser()
    ddp.add_arguments(parser)
    return parser.parse_args(["--arch", DDP_ARCH.name, "--layers", "1", "--method", "qerl", "--rank", "4",
                              "--prompts-per-rank", "2", "--group-size", "2", "--prompt", "8", "--completion", "4",
                              "--steps", "2", "--dtype", "float32", "--config", str(REPO / "config" / "config.yaml"),
                              "--out", str(out)])


# ---- the test --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Data, a random tiny base model, and the two-rank run of every case."""
    root = tmp_path_factory.mktemp("dist")
    write_splits(root / "data", 0, 50, 200, 4, [1, 2])
    tok = build_tokenizer()
    build_model(tok, seed=0).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    cfg = validate_config(json.loads(json.dumps(CONFIG)))
    (root / "cfg.json").write_text(json.dumps(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", QERL_DIST_BACKEND="gloo", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
                           __file__, str(root)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return cfg, root


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method, task", UPDATE_CASES, ids=[f"{m}-{t}" for m, t in UPDATE_CASES])
@pytest.mark.parametrize("split", ["whole", "parts", "parts-one-process"])
def test_update_equals_one_process(ran, method, task, split):
    """The ranks' update equals one process's on the whole batch; so does an update whose minibatches accumulate
    their gradient over parts of train.update_max_rows rows (on the ranks, and in one process)."""
    cfg, root = ran
    torch.set_num_threads(1)
    one = _update_case(cfg, root, method, task, DistContext())
    if split == "parts-one-process":
        ranks = [_update_case(_parts(cfg), root, method, task, DistContext())]
    else:
        ranks = [torch.load(root / f"{'update' if split == 'whole' else 'parts'}_{method}_{task}_rank{r}.pt")
                 for r in range(WORLD)]
    assert len(one["losses"]) == 2, "both minibatches must update"
    for r in ranks:
        assert r["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-7)
        assert r["grad_norms"] == pytest.approx(one["grad_norms"], rel=1e-5)
        assert r["clip"] == pytest.approx(one["clip"], rel=1e-5, abs=1e-7)
        if task == "grpo":
            assert r["kl"] == pytest.approx(one["kl"], rel=1e-5)
        assert all(_close(r["after"][n], one["after"][n]) for n in one["after"]), method
    moved = max(float((one["after"][n] - one["before"][n]).abs().max()) for n in one["after"])
    assert moved > 1e-4  # a real update, large against the tolerance
    if len(ranks) == WORLD:
        assert all(torch.equal(ranks[0]["after"][n], ranks[1]["after"][n]) for n in one["after"])  # replicas agree


def test_train_equals_one_process_and_resumes(ran, tmp_path, monkeypatch):
    cfg, root = ran
    torch.set_num_threads(1)
    monkeypatch.setattr(S, "sample", _per_prompt_sample)
    monkeypatch.setattr(S, "compute_rewards", _hashed_rewards)
    (tmp_path / "data").symlink_to(root / "data")
    (tmp_path / "base").symlink_to(root / "base")
    one = _train(cfg, tmp_path, "one")
    rows = lambda d: [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    ref, two = rows(tmp_path / "one"), rows(root / "two")
    assert [r["step"] for r in two] == [0, 1]  # written once, by rank 0
    for a, b in zip(ref, two):
        for k in a.keys() - TIMING:
            assert b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-7), k
    assert two[0]["rollout_tokens"] > 0 and 0 < two[0]["reward"] < 1
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING} for r in rs]
    assert strip(rows(root / "killed")) == strip(two)
    chunks = lambda d: [(k, p.read_bytes()) for k, p in rollout_chunks(d / "rollouts")]
    assert [k for k, _ in chunks(root / "two")] == [0, 1]
    assert len(read_rollouts(root / "two" / "rollouts")) == 2 * 3 * G  # every rank's prompts, gathered on rank 0
    assert chunks(root / "killed") == chunks(root / "two")  # resumed: byte for byte
    for a, b in zip(read_rollouts(root / "two" / "rollouts"), read_rollouts(tmp_path / "one" / "rollouts")):
        assert (a.prompt_id, a.completion, a.reward, a.length) == (b.prompt_id, b.completion, b.reward, b.length)
        assert (a.logprob_mean, a.entropy) == pytest.approx((b.logprob_mean, b.entropy), rel=1e-5, abs=1e-7)
    saved = [torch.load(root / f"train_rank{r}.pt") for r in range(WORLD)]
    params = _trainable(one["model"])
    assert all(_close(saved[0]["full"][n], params[n]) for n in params)
    assert any(float(params[n].abs().max()) > 0 for n in params if "lora_B" in n)  # the adapter was trained
    for r in saved:
        assert all(torch.equal(r["full"][n], saved[0]["full"][n]) for n in params)
        assert all(torch.equal(r["resumed"][n], saved[0]["full"][n]) for n in params)
    assert (root / "two" / "adapter").is_dir() and json.loads((root / "two" / "run.json").read_text())[
        "distributed"] == {"world_size": WORLD, "backend": "gloo"}


def test_ddp_benchmark_runs_on_two_ranks(ran):
    _, root = ran
    rows = list(csv.DictReader((root / "ddp" / "ddp.csv").open()))
    assert len(rows) == 1 and tuple(rows[0]) == ddp.COLUMNS
    row = rows[0]
    assert (row["world_size"], row["global_prompts"], row["group_size"]) == ("2", "4", "2")
    assert float(row["tokens_per_s"]) > 0 and float(row["step_s"]) >= float(row["rollout_s"]) > 0
    detail = json.loads((root / "ddp" / f"ddp_{DDP_ARCH.name}_qerl_w2.json").read_text())
    assert detail["replicas_in_sync"] and [r["tokens"] for r in detail["steps"]] == [32.0, 32.0]  # 2 ranks x 2 prompts x 2 samples x 4 tokens


@pytest.mark.parametrize("n, world, expected", [(3, 2, [(0, 2), (2, 3)]), (4, 2, [(0, 2), (2, 4)]),
                                                (5, 3, [(0, 2), (2, 4), (4, 5)])], ids=["3on2", "4on2", "5on3"])
def test_shard_range(n, world, expected):
    assert [shard_range(n, r, world) for r in range(world)] == expected


def test_shard_range_needs_a_prompt_per_rank():
    with pytest.raises(ValueError, match="prompts_per_step"):
        shard_range(1, 0, 2)


def test_gpu_claims_are_exclusive(tmp_path):
    ids, fds = claim_gpus(2, ["0", "1", "2"], tmp_path)
    assert ids == ["0", "1"]
    assert claim_gpus(1, ["0", "1", "2"], tmp_path)[0] == ["2"]  # same process: flock is per open file
    probe = "from qerl.rl.distributed import claim_gpus; import sys; claim_gpus(1, ['0','1'], sys.argv[1], " \
            "poll_s=0.1, timeout_s=0.3)"
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode != 0 and "no 1 free GPUs" in proc.stderr  # another job waits for them
    for fd in fds:
        os.close(fd)
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(RuntimeError, match="asks for 3 GPUs"):
        claim_gpus(3, ["0", "1"], tmp_path)



def test_a_non_finite_gradient_skips_the_update(ran, monkeypatch):
    """An inf/NaN gradient norm skips the optimizer step (the clip would turn every weight into NaN)."""
    cfg, root = ran
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, max_norm: torch.tensor(float("inf")))
    out = _update_case(cfg, root, "lora", "grpo", DistContext())
    assert out["losses"] == [] and out["grad_norms"] == []
    assert all(torch.equal(out["before"][n], out["after"][n]) for n in out["before"])

def test_gpu_slots_let_k_jobs_share_a_gpu(tmp_path):
    first, _ = claim_gpus(1, ["0"], tmp_path, slots=2)
    second, _ = claim_gpus(1, ["0"], tmp_path, slots=2)  # the second slot of the same GPU
    assert first == second == ["0"]
    with pytest.raises(RuntimeError, match="no 1 free GPUs"):  # a third job waits
        claim_gpus(1, ["0"], tmp_path, slots=2, poll_s=0.05, timeout_s=0.1)
    assert claim_gpus(2, ["0", "1"], tmp_path / "b", slots=3)[0] == ["0", "1"]  # n GPUs: one slot on each
    with pytest.raises(ValueError, match="jobs_per_gpu"):
        claim_gpus(1, ["0"], tmp_path, slots=0)

if __name__ == "__main__":  # one rank of the torchrun job the fixture launches
    _worker(Path(sys.argv[1]))
