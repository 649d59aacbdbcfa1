"""The RL trainer end to end on CPU at a toy size: every method trains, resume is exact, NaN losses abort, and every
metrics line is a qerl.contract.records.MetricsRow."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file as safetensors_load

from qerl.config import validate_config
from qerl.contract.paths import rollout_chunks
from qerl.contract.records import METRIC_FIELDS, WALL_CLOCK_FIELDS, read_metrics_rows, read_rollouts
from qerl.contract.variants import canonical_variant, parse_variant
from qerl.data.prompts import build_prompt
from qerl.data.tiny import write_splits
from qerl.models.pretrain import encode_examples, pretrain
from qerl.models.tiny import build_model, build_tokenizer
from qerl.rl import step as S
from qerl.rl import trainer as T
from qerl.rl.settings import build_run_policy, resolve_settings

TIMING = set(WALL_CLOCK_FIELDS)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    write_splits(root / "data", 0, 600, 200, 4, [1, 2])
    tok = build_tokenizer()
    model = build_model(tok, seed=0)
    rows = [json.loads(l) for l in (root / "data" / "pretrain.jsonl").read_text().splitlines()]
    pretrain(model, encode_examples(rows, tok, "none"), steps=40, time_budget_s=300, batch_size=32, lr=3e-3,
             warmup_steps=5, weight_decay=0.0, seed=0)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    cfg = validate_config({
        "prompt": {"instruction": "none"},
        "train": {"steps": 4, "prompts_per_step": 2, "checkpoint_every": 2, "lr": 1e-3, "lr_by_method": {},
                  "lora": {"rank": 4, "alpha": 8},
                  "aqn": {"stages": 2, "sigma_start": 0.05, "sigma_end": 0.01},
                  "tasks": {"t": {"source": "tiny", "algorithm": "grpo", "group_size": 4, "updates_per_rollout": 2,
                                  "max_new_tokens": 10},
                            "d": {"source": "tiny", "algorithm": "dapo", "group_size": 4, "updates_per_rollout": 1,
                                  "max_new_tokens": 10, "dynamic_sampling": True, "overlong_filter": True}}},
    })
    return cfg, root


def _run(setup, tmp_path, method, task="t", variant="default", **kw):
    cfg, root = setup
    s = resolve_settings(cfg, task, method, variant, seed=0)
    out = tmp_path / "run"
    return T.train(cfg, s, root / "base", out, data_dir=root / "data", progress=False, **kw), out


def _metrics(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["full", "lora", "mxfp4_lora", "nvfp4_lora", "qerl", "qlora"])
def test_every_method_trains(setup, tmp_path, method):
    if method == "qlora":
        from baselines.nf4 import bitsandbytes_cpu_problem

        if bitsandbytes_cpu_problem():
            pytest.skip(bitsandbytes_cpu_problem())
    result, run_dir = _run(setup, tmp_path, method)
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [list(r) for r in rows] == [list(METRIC_FIELDS)] * 4  # the contract's fields, in its order
    assert [r.step for r in read_metrics_rows(run_dir / "metrics.jsonl")] == [0, 1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["grad_norm"])) for r in rows)
    weights = run_dir / ("model" if method == "full" else "adapter")
    assert weights.is_dir() and any(weights.iterdir())
    sigmas = [r["sigma"] for r in rows]
    if method == "qerl":
        assert sigmas[0] == 0.0 and sigmas[-1] > 0  # stage 0 adds nothing (Alg. 1), stage 1 adds sigma_start
    else:
        assert sigmas == [0.0] * 4


def test_dapo_task_trains(setup, tmp_path):
    _, run_dir = _run(setup, tmp_path, "qerl", task="d")
    assert len(_metrics(run_dir)) == 4


@pytest.mark.parametrize("method", ["full", "lora", "qerl"])
def test_first_minibatch_pass_gives_its_rows_old_logprobs(setup, method):
    """rl_step's old pass leaves out the rows of the update's first minibatch, whose own pass (with grad, before any
    optimizer step) gives their old log-probs, and runs minibatch by minibatch: on the CPU bit for bit one pass over
    every row."""
    cfg, root = setup
    s = resolve_settings(cfg, "t", method, "default", seed=0)  # GRPO, 2 updates per rollout
    torch.manual_seed(0)
    policy = build_run_policy(s, root / "base")
    problems = T.load_task_problems(cfg, s, root / "data")[:3]
    prompts = [build_prompt(p.question, policy.tokenizer, s.instruction) for p in problems]
    rb = S.sample(policy.model, policy.tokenizer, prompts, group_size=s.group_size, max_new_tokens=s.max_new_tokens,
                  generator=torch.Generator().manual_seed(0))
    ids, attn, P, n = rb.input_ids, rb.attention_mask, rb.prompt_len, rb.input_ids.shape[0]
    mbs = S.minibatches(s, 1, n)
    first = mbs[0]
    rest = torch.tensor([i not in first.tolist() for i in range(n)])
    with torch.no_grad():
        full, _ = S.sequence_logprobs(policy.model, ids, attn, P)
        old = S._old_logprobs(policy.model, ids, attn, P, mbs)
    assert torch.isnan(old[first]).all() and torch.equal(old[rest], full[rest])
    policy.model.train()
    logp, _ = S.sequence_logprobs(policy.model, ids[first], attn[first], P)  # the update's pass of that minibatch
    assert logp.requires_grad and torch.equal(logp.detach(), full[first])
    with torch.no_grad():  # a rank holding rows 4..7 of the batch: its rows of the first minibatch left out
        shard = S._old_logprobs(policy.model, ids[4:8], attn[4:8], P, mbs, row_offset=4)
    skipped = torch.isin(torch.arange(4), first - 4)
    assert torch.isnan(shard[skipped]).all() and torch.equal(shard[~skipped], full[4:8][~skipped])


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


# What a kill (or Snakemake's cleanup of a failed / incomplete job) leaves of metrics.jsonl before the rerun.
_LOSSES = {"kept": lambda path: None, "deleted": lambda path: path.unlink(),
           "truncated": lambda path: path.write_text(path.read_text().splitlines()[0] + "\n"),
           "empty": lambda path: path.write_text("")}


@pytest.mark.parametrize("loss", list(_LOSSES))
def test_resume_is_exact(setup, tmp_path, loss, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    full, dir_a = _run(setup, tmp_path / "a", "qerl")
    part, dir_b = _run(setup, tmp_path / "b", "qerl", stop_after=2)
    written = (dir_b / "metrics.jsonl").read_text()
    assert len(written.splitlines()) == 2 and (dir_b / "checkpoint.pt").exists()
    _LOSSES[loss](dir_b / "metrics.jsonl")
    capsys.readouterr()
    resumed, _ = _run(setup, tmp_path / "b", "qerl")
    assert f"resumed from {dir_b / 'checkpoint.pt'} at step 2 of 4" in capsys.readouterr().err
    rows = _metrics(dir_b)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert (dir_b / "metrics.jsonl").read_text().startswith(written)  # the history before the kill, byte for byte
    assert _strip(_metrics(dir_a)) == _strip(rows)
    chunks = [(k, p.read_bytes()) for k, p in rollout_chunks(dir_a / "rollouts")]
    assert [k for k, _ in chunks] == [0, 3]  # the defaults keep step 0 and the last step
    assert [(k, p.read_bytes()) for k, p in rollout_chunks(dir_b / "rollouts")] == chunks  # byte for byte
    pa = {n: p for n, p in full["model"].named_parameters() if p.requires_grad}
    pb = {n: p for n, p in resumed["model"].named_parameters() if p.requires_grad}
    assert pa.keys() == pb.keys() and all(torch.equal(pa[n], pb[n]) for n in pa)


def test_rollout_samples_agree_with_metrics(setup, tmp_path):
    """Every completion of every step kept: the samples' means are the step's metrics."""
    cfg, root = setup
    cfg = {**cfg, "train": {**cfg["train"], "rollout_samples": {"every": 1, "share": 1.0}}}
    s = resolve_settings(cfg, "t", "qerl", "default", seed=0)
    T.train(cfg, s, root / "base", tmp_path, data_dir=root / "data", progress=False)
    samples = read_rollouts(tmp_path / "rollouts")
    rows = read_metrics_rows(tmp_path / "metrics.jsonl")
    assert len(samples) == 4 * 2 * 4  # steps x prompts x group_size
    for row in rows:
        mine = [x for x in samples if x.step == row.step]
        assert [x.sample for x in mine] == [0, 1, 2, 3] * 2 and len({x.prompt_id for x in mine}) == 2
        assert sum(x.reward for x in mine) / len(mine) == pytest.approx(row.reward)
        assert sum(x.correct for x in mine) / len(mine) == pytest.approx(row.accuracy)
        assert sum(x.length for x in mine) / len(mine) == pytest.approx(row.response_length)
        assert sum(x.truncated for x in mine) / len(mine) == pytest.approx(row.truncated_fraction)
        assert {x.sigma for x in mine} == {row.sigma}
        assert all(x.logprob_mean <= 0 and x.entropy >= 0 for x in mine)
        assert sum(x.entropy * x.length for x in mine) / sum(x.length for x in mine) == pytest.approx(row.entropy,
                                                                                                     rel=1e-5)


def test_tensorboard_holds_the_metrics_of_a_resumed_run(setup, tmp_path):
    """train.report_to: [tensorboard], killed after step 2 and resumed: the event files hold metrics.jsonl's rows."""
    pytest.importorskip("tensorboard")
    from tests.rl.test_trackers import assert_same, read_tensorboard

    cfg, root = setup
    cfg = {**cfg, "train": {**cfg["train"], "report_to": ["tensorboard"]}}
    s = resolve_settings(cfg, "t", "lora", "default", seed=0)
    T.train(cfg, s, root / "base", tmp_path, data_dir=root / "data", progress=False, stop_after=2)
    T.train(cfg, s, root / "base", tmp_path, data_dir=root / "data", progress=False)
    assert_same(read_tensorboard(tmp_path / "tensorboard"), read_metrics_rows(tmp_path / "metrics.jsonl"))


def test_rerun_of_a_finished_run_keeps_its_history(setup, tmp_path, capsys):
    """Killed in its in-job evaluation: the checkpoint is at the last step; Snakemake deletes metrics.jsonl."""
    _, run_dir = _run(setup, tmp_path, "lora")
    written = (run_dir / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").unlink()
    capsys.readouterr()
    result, _ = _run(setup, tmp_path, "lora")
    err = capsys.readouterr().err
    assert "at step 4 of 4" in err and "training is complete" in err
    assert (run_dir / "metrics.jsonl").read_text() == written
    assert result["steps"] == 4 and (run_dir / "adapter").is_dir()


@pytest.mark.slow
def test_cli_killed_in_a_step_then_metrics_deleted_resumes_with_full_history(setup, tmp_path, capsys):
    """`qerl train` SIGKILLed in step 3 (checkpoint at step 2, lines of steps 0-2 written), metrics.jsonl deleted,
    rerun: exit 0 with the lines of steps 0-3, those before the checkpoint byte for byte (never a short file).
    The killed run is a process of its own (a real SIGKILL); the rerun is the same command line through
    qerl.cli.main in this process, which spares a second process's ~6 CPU-seconds of imports."""
    from qerl.cli import main
    cfg, root = setup
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**cfg, "evaluate": {**cfg["evaluate"], "n_repeats": 1, "max_new_tokens": 10}},
                                     sort_keys=False))
    out = tmp_path / "run"
    args = ["train", "--config", str(config), "--task", "t", "--method", "lora", "--seed", "0", "--base",
            str(root / "base"), "--data", str(root / "data"), "--out", str(out), "--no-progress", "--device", "cpu"]
    killer = Path(__file__).resolve().parents[1] / "kill_in.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(killer.parents[1]), os.environ.get("PYTHONPATH", "")])}
    killed = subprocess.run([sys.executable, str(killer), "qerl.rl.step:compute_rewards", "3", "-", *args],
                            capture_output=True, text=True, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in before] == [0, 1, 2] and (out / "checkpoint.pt").exists()
    (out / "metrics.jsonl").unlink()
    capsys.readouterr()
    threads = torch.get_num_threads()
    try:
        code = main(args)  # `qerl train` sets its own thread count (train.threads)
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert f"resumed from {out / 'checkpoint.pt'} at step 2 of 4" in err
    after = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in after] == [0, 1, 2, 3]
    assert after[:2] == before[:2]
    assert _strip([json.loads(after[2])]) == _strip([json.loads(before[2])])  # step 2 again from the checkpoint
    train_info = json.loads((out / "eval.json").read_text())["train"]
    assert train_info["steps"] == 4
    # the job's seconds by phase (qerl.profiling.stage_costs reads them)
    assert set(train_info["seconds"]) == {"setup", "steps", "save", "evaluate"}
    assert all(v >= 0 for v in train_info["seconds"].values()) and train_info["seconds"]["steps"] > 0


def test_checkpoint_without_history_refuses_a_short_metrics_file(setup, tmp_path):
    _, run_dir = _run(setup, tmp_path, "lora", stop_after=2)
    ckpt = run_dir / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=False)
    del state["history"], state["identity"]  # as checkpoints were written before they carried the history
    torch.save(state, ckpt)
    (run_dir / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text().splitlines()[1] + "\n")
    with pytest.raises(ValueError, match=r"checkpoint.pt is at step 2, but .*metrics.jsonl holds steps 1-1 .*"
                                         r"Delete .*checkpoint.pt and .*metrics.jsonl"):
        _run(setup, tmp_path, "lora")
    (run_dir / "metrics.jsonl").unlink()
    with pytest.raises(ValueError, match="holds no metrics"):
        _run(setup, tmp_path, "lora")


def test_checkpoint_of_other_settings_is_not_resumed(setup, tmp_path, capsys):
    _, run_dir = _run(setup, tmp_path, "lora", stop_after=2)
    old_lr = _metrics(run_dir)[0]["lr"]
    capsys.readouterr()
    _run(setup, tmp_path, "lora", variant="lr2e-3")  # a config edit reruns the job in the same folder
    err = capsys.readouterr().err
    assert "ignoring" in err and "lr: 0.001 -> 0.002" in err and "training from step 0" in err
    assert [r["step"] for r in _metrics(run_dir)] == [0, 1, 2, 3]
    assert _metrics(run_dir)[0]["lr"] == pytest.approx(2 * old_lr)  # step 0 was trained again, at the new rate


def test_nan_losses_abort(setup, tmp_path, monkeypatch):
    real = S.grpo_loss

    def nan_loss(*a, **k):
        loss, diag = real(*a, **k)
        return loss * float("nan"), diag

    monkeypatch.setattr(S, "grpo_loss", nan_loss)
    with pytest.raises(RuntimeError, match="consecutive steps had a NaN/Inf loss"):
        _run(setup, tmp_path, "lora")


@pytest.mark.parametrize("variant, expected", [("default", {}), ("noaqn", {"aqn": False}),
                                               ("aqn-cosine", {"aqn": True, "aqn_schedule": "cosine"}),
                                               ("rank16", {"lora_rank": 16}), ("lr3e-05", {"lr": 3e-5}),
                                               ("tis2", {"tis_cap": 2.0}), ("tis1.5", {"tis_cap": 1.5}),
                                               ("norms", {"train_norms": True})])
def test_variants(variant, expected):
    assert parse_variant(variant) == expected


def test_aqn_on_bf16_lora_perturbs_rollouts_and_the_mismatch_shows_it(setup, tmp_path):
    _, plain = _run(setup, tmp_path / "plain", "lora")
    _, noisy = _run(setup, tmp_path / "noisy", "lora", variant="aqn-exponential")
    clean, aqn = _metrics(plain), _metrics(noisy)
    assert [r["sigma"] for r in clean] == [0.0] * 4 and aqn[0]["sigma"] == 0.0 and aqn[-1]["sigma"] > 0
    for row in clean:  # no noise: the sampler and the teacher-forced forward differ by float rounding alone
        assert row["mismatch_kl"] < 1e-9 and abs(row["is_ratio_max"] - 1.0) < 1e-4
    noisy_steps = [r for r in aqn if r["sigma"] > 0]
    assert all(r["mismatch_kl"] > 1e-7 for r in noisy_steps)
    assert all(r["is_ratio_p99"] <= r["is_ratio_max"] for r in aqn)


def test_tis_and_norms_variants_train(setup, tmp_path):
    cfg, root = setup
    _, run_dir = _run(setup, tmp_path / "tis", "qerl", variant="tis2")
    assert len(_metrics(run_dir)) == 4
    s = resolve_settings(cfg, "t", "lora", "norms", 0)
    assert s.train_norms
    result = T.train(cfg, s, root / "base", tmp_path / "norms", data_dir=root / "data", progress=False)
    trained = [n for n, p in result["model"].named_parameters() if p.requires_grad and "norm" in n]
    assert len(trained) == 4 and all("layernorm.modules_to_save" in n for n in trained)  # 2 layers x 2 norms
    saved = (tmp_path / "norms" / "adapter" / "adapter_config.json").read_text()
    assert "input_layernorm" in saved and "post_attention_layernorm" in saved
    with pytest.raises(ValueError, match="already trains every weight"):
        resolve_settings(cfg, "t", "full", "norms", 0)


def test_canonical_variants():
    cfg = {"train": {"aqn": {"schedule": "exponential"}, "lora": {"rank": 16}, "lr": 1e-3, "lr_by_method": {}}}
    assert canonical_variant(cfg, "qerl", "aqn-exponential") == "default"
    assert canonical_variant(cfg, "lora", "aqn-exponential") == "aqn-exponential"
    assert canonical_variant(cfg, "lora", "noaqn") == "default"
    assert canonical_variant(cfg, "qerl", "noaqn") == "noaqn"
    assert canonical_variant(cfg, "qerl", "tis2") == "tis2"


def test_bad_variant_and_task(setup):
    cfg, _ = setup
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variant("rnak8")
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        resolve_settings(cfg, "nope", "qerl", "default", 0)
    with pytest.raises(ValueError, match="nothing to train"):
        resolve_settings(cfg, "t", "nvfp4", "default", 0)


def test_rank_variant_keeps_lora_scale(setup):
    cfg, _ = setup
    s = resolve_settings(cfg, "t", "qerl", "rank8", 0)
    assert s.lora_rank == 8 and s.lora_alpha / s.lora_rank == 2.0


def _eval_record(path):
    """eval.json without what differs between two runs of the same training (times, provenance, environment)."""
    def drop(obj):
        if isinstance(obj, dict):
            return {k: drop(v) for k, v in obj.items() if k not in {"seconds", "provenance", "environment"} | TIMING}
        return [drop(v) for v in obj] if isinstance(obj, list) else obj
    return drop(json.loads(path.read_text()))


def test_cli_several_runs_in_one_process_write_what_one_call_per_run_writes(setup, tmp_path, capsys):
    """`qerl train --variant lr2e-3 default --seed 1 0 --out A B` (the DAG's grouped training job) writes, for each
    run, the metrics, adapter and eval.json of that run's own `qerl train`; lists of other lengths are an error."""
    from qerl.cli import main

    cfg, root = setup
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**cfg, "evaluate": {**cfg["evaluate"], "n_repeats": 1, "max_new_tokens": 10}},
                                     sort_keys=False))
    common = ["train", "--config", str(config), "--task", "t", "--method", "lora", "--base", str(root / "base"),
              "--data", str(root / "data"), "--no-progress", "--device", "cpu"]
    assert main(common + ["--seed", "0", "--out", str(tmp_path / "alone0")]) == 0
    assert main(common + ["--variant", "lr2e-3", "default", "--seed", "1", "0",
                          "--out", str(tmp_path / "g1"), str(tmp_path / "g0")]) == 0
    alone, grouped = tmp_path / "alone0", tmp_path / "g0"
    assert _strip(_metrics(grouped)) == _strip(_metrics(alone))
    assert _eval_record(grouped / "eval.json") == _eval_record(alone / "eval.json")
    for f in (alone / "adapter").iterdir():
        if f.suffix == ".safetensors":
            a, b = (safetensors_load(d / "adapter" / f.name) for d in (alone, grouped))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    first = _metrics(tmp_path / "g1")[0]  # the other run is its own: variant lr2e-3, seed 1
    assert first["lr"] == pytest.approx(2 * _metrics(alone)[0]["lr"])
    assert json.loads((tmp_path / "g1" / "eval.json").read_text())["train"]["settings"]["seed"] == 1
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["variant"], p["seed"]) for p in printed] == [("default", 0), ("lr2e-3", 1), ("default", 0)]
    assert main(common + ["--seed", "0", "1", "--out", str(tmp_path / "x")]) == 2
    assert "--seed gives 2 seed(s) (0 1) but --out 1 run folder(s)" in capsys.readouterr().err
    assert main(common + ["--variant", "default", "lr2e-3", "--seed", "0", "1", "2", "--out", "a", "b", "c"]) == 2
    assert "--variant gives 2 variants (default lr2e-3) for 3 seeds (0 1 2)" in capsys.readouterr().err
