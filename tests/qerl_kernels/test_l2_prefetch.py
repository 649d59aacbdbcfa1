"""qerl_kernels.l2_prefetch: the PTX L2 prefetch of a tensor's lines (a cache hint; GPU) and its argument checks."""
from __future__ import annotations

import pytest
import torch

from qerl_kernels.l2_prefetch import l2_prefetch


def test_rejects_what_it_cannot_prefetch():
    with pytest.raises(ValueError, match="l2_prefetch"):
        l2_prefetch(torch.zeros(4))                     # a CPU tensor
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="l2_prefetch"):
            l2_prefetch(torch.zeros(4, 4, device="cuda").t())   # not contiguous


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="PTX prefetch needs a GPU")
@pytest.mark.parametrize("shape,dtype", [((0,), torch.int32), ((1,), torch.uint8), ((3, 1000), torch.int16),
                                         ((4096, 3584 // 8), torch.int32)])
def test_prefetch_leaves_the_data_and_the_stream_usable(shape, dtype):
    t = torch.randint(0, 100, shape, dtype=dtype, device="cuda")
    before = t.clone()
    l2_prefetch(t)
    l2_prefetch(t, ctas=1)
    torch.cuda.synchronize()
    assert torch.equal(t, before)
