"""The bound the 4-bit kernels' outputs are held to in their tests (the skinny-M and the decode-size MMA kernels)."""
import torch

from qerl_kernels import reference as R


def check_w4a16_close(y: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> None:
    """Elementwise: y within one rounding to its dtype of the float32 reference `ref` (two: the interpreter's
    float32 -> bfloat16 casts round half-up), plus fp32 summation-order noise relative to `scale` (sum |x| |w|);
    relative error under 6e-3 (bf16) / 1e-3 (fp16)."""
    eps = 2.0 ** -8 if y.dtype == torch.bfloat16 else 2.0 ** -11
    err = (y.float() - ref).abs()
    bound = 2 * eps * ref.abs() + 1e-5 * scale + 1e-6
    assert torch.isfinite(y).all()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3e} (max err {err.max().item():.3e})"
    assert R.rel_error(y, ref) < (6e-3 if y.dtype == torch.bfloat16 else 1e-3)
