"""Profiling at real sizes: random-weight Qwen2.5 architectures, rollout throughput, GRPO step time, memory."""
