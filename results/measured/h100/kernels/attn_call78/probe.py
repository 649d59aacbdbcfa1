"""Issue 22, call 78: the decode attention's key splits (qerl_kernels.decode.attention_splits: at least two 64-key
blocks a split, so 8 at span 1024) on the 7B shape (28 query heads, 4 kv heads, d 128) with o's LoRA down-products in
the combine kernel (rank 32), at batch 1 and 8 and spans 1024 / 2048: 4-32 splits, each op captured once per layer
(28 layers' caches, more than the L2) and the graph's replay divided by 28, every row twice (the order reversed).
Run: PYTHONPATH=$PWD python3 <this file>."""
import torch

from qerl_kernels import decode
from qerl_kernels.bench import time_graph

L, H, KVH, D, MAXLEN = 28, 28, 4, 128, 2312
for b in (1, 8):
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
        rows = [s for s in (4, 8, 16, 32) if s <= span // 64]
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
