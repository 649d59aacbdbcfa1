"""Evaluation: pass@1 over repeats on GSM8K, MATH-500, AIME 2024/2025, AMC 23 and the tiny held-out split.

Modules (imported on use, so `import qerl.evaluate` stays light):
    tasks          lm-eval tasks generated in code for our local JSONL files (prompt, sampling, repeats, grading)
    lm             the seeded, KV-cached sampler and the in-memory lm-eval `LM` around any model
    run            evaluate_model (the library entry point of `qerl evaluate`, qerl/commands/evaluate.py)
    adapter_check  the adapter-active probe (logits with and without the adapter must differ)
    stats          pass@1 over repeats and its standard error over problems
    grade_check    the grader on each benchmark's own reference answers (`qerl grade-check`)

The model an evaluation runs is built by the policy core (qerl.policy.build_policy): checkpoint folder -> weight
format (bf16/nf4/mxfp4/nvfp4, or the quantization stage's checkpoint) -> optional LoRA adapter.
"""

__all__ = ["tasks", "lm", "run", "adapter_check", "stats", "grade_check"]
