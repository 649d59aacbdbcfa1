"""Issue 22, call 79: as call 78 (the decode attention's key splits, 7B shape, o's LoRA down-products in the combine
kernel, 28 layers in a graph, every row twice) at batch 16, 32 and 64, where call 78's finding (batch 1 fastest with
one 64-key block a split, batch 8 with ~2 programs an SM) would change the split count.
Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import decode
from qerl_kernels.bench import time_graph

L, H, KVH, D, MAXLEN = 28, 28, 4, 128, 2312
for b in (16, 32, 64):
    g = torch.Generator(device="cuda").manual_seed(0)
    kc = [torch.randn(b, KVH, MAXLEN, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(L)]
    vc = [torch.randn(b, KVH, MAXLEN, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(L)]
    q = [torch.randn(b, H, D, device="cuda", generator=g).to(torch.bfloat16) for _ in range(L)]
    a = [(0.02 * torch.randn(32, H * D, device="cuda", generator=g)).to(torch.bfloat16) for _ in range(L)]
    valid = torch.ones(b, MAXLEN, dtype=torch.bool, device="cuda")
    first = torch.zeros(b, dtype=torch.int32, device="cuda")
    for span in (1024, 2048):
        slot = torch.tensor([span - 1], device="cuda")
        default = decode.attention_splits(b, KVH, span)
        ref = decode.decode_attention(q[0], kc[0], vc[0], valid, slot, span, D ** -0.5, use_triton=True,
                                      first=first, lora_a=a[0])
        rows = [s for s in (2, 3, 4, 6, 8, 16) if s <= span // 64]   # 1: no combine kernel
        for rep, order in enumerate((rows, rows[::-1])):
            for ns in order:
                def step(ns=ns, kc=kc, vc=vc):
                    for i in range(L):
                        decode.decode_attention(q[i], kc[i], vc[i], valid, slot, span, D ** -0.5, use_triton=True,
                                                splits=ns, first=first, lora_a=a[i])
                err = ""
                if rep == 0:
                    o, t = decode.decode_attention(q[0], kc[0], vc[0], valid, slot, span, D ** -0.5,
                                                   use_triton=True, splits=ns, first=first, lora_a=a[0])
                    err = (f" max|diff| out {(o.float() - ref[0].float()).abs().max().item():.1e} "
                           f"t {(t.float() - ref[1].float()).abs().max().item():.1e}")
                us = time_graph(step) / L
                print(f"batch {b} span {span} pass {rep} splits {ns}{' (default)' if ns == default else ''}: "
                      f"{us:.2f} us a layer{err}", flush=True)
    del kc, vc
    torch.cuda.empty_cache()
