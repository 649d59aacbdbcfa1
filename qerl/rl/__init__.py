"""RL training: GRPO and DAPO on one model that serves rollouts and log-probs.

Modules (the dependency runs settings -> step -> resume -> trainer; every policy comes from qerl.policy):
    settings     RunSettings from the config, task, method and variant; the run's LoRA / AQN specs, optimizer and
                 learning-rate schedule
    step         `rl_step`: one GRPO / DAPO step (rollout, rewards, advantages, log-probs, `policy_update`); the step
                 the trainer runs and `qerl profile` / the DDP benchmark time
    resume       resumable checkpoints, the run's identity, restoring the metrics history
    trainer      `train`: the run loop (stratified prompt batches, metrics.jsonl, checkpoints, saved weights)
    rollout      batched sampling with a KV cache and teacher-forced log-probs; engine: the CUDA decode engine
                 (engine_groups: its projection groups, the frozen bases and stacked LoRA factors it reads)
    losses       advantages, GRPO and DAPO losses; mismatch: rollout-train mismatch and TIS weights
    rewards      answer extraction and math-verify grading; distributed: data parallelism helpers
`qerl train` (qerl/commands/train.py) chains `train` with the evaluation of the trained policy.
"""
