"""Baselines QeRL is compared with: BF16 LoRA, full fine-tuning, QLoRA (bitsandbytes NF4)."""
