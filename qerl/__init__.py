"""QeRL reproduction harness: NVFP4/MXFP4/NF4 quantization, LoRA RL (GRPO/DAPO) with Adaptive Quantization Noise,
evaluation and the paper's tables and figures. See README.md."""
__version__ = "0.1.0"
__all__ = ["__version__"]
