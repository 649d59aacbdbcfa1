import torch, triton
from qerl_kernels import nvfp4, fp4_launch as L
from qerl_kernels.reference import nvfp4_quantize_reference
for n, k in ((18944, 3584), (3584, 18944), (3584, 3584)):
    w = torch.randn(n, k, device="cuda") * 0.02
    p = nvfp4.prepare(*nvfp4_quantize_reference(w))
    wb = w.bfloat16()
    for m in (128, 256):
        g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        res = {}
        for path in ("swap", "wgmma", "deq"):
            f = lambda: L.fp4_gemm_t(g, p, path=path)
            f(); torch.cuda.synchronize()
            eager = triton.testing.do_bench(f, warmup=5, rep=25)
            graph = triton.testing.do_bench_cudagraph(f, rep=20)
            res[path] = (eager * 1e3, graph * 1e3)
        bf = triton.testing.do_bench(lambda: g @ wb, warmup=5, rep=25) * 1e3
        print(f"{n}x{k} M={m} bf16 eager {bf:.1f} | " + " | ".join(f"{p_} eager {e:.1f} graph {gr:.1f}" for p_, (e, gr) in res.items()), flush=True)
