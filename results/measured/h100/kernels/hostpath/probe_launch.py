"""The Gluon kernels' eager host path with the compiled binary reused (qerl_kernels.gluon_launch) against the JIT's
route of before (each launch through `kernel[grid](...)`, the weight's two TMA descriptors built a call), on the
7B o, gate and down weights: (1) 300 back-to-back eager calls of the backward kernel (wall us a call: the host's
pace where it exceeds the GPU's), (2) every backward path at M 64 / 128 / 256 timed as the dispatch times it (do_bench,
eager) and in a CUDA graph, beside bf16 cuBLAS grad_y @ W, (3) which path the dispatch then takes."""
import time

import torch
import triton

from qerl_kernels import fp4_launch as L
from qerl_kernels import fp4_wgmma_t, gluon_launch, nvfp4
from qerl_kernels.reference import nvfp4_quantize_reference

NEW = gluon_launch.launch


def jit_route(kernel, grid, args, meta):  # the launch of before: the JIT's whole path every call
    kernel[(grid,)](*args, **meta)


def route(name, p):
    fp4_wgmma_t.launch = NEW if name == "cached" else jit_route
    if name != "cached":
        p.__dict__.pop("_tma_descriptors", None)   # the weight's descriptors built again each call, as before


def call(g, p, path, name="cached"):
    if path == "wgmma":
        route(name, p)
    return L.fp4_gemm_t(g, p, path=path)


weights = {}
for label, (n, k) in (("o", (3584, 3584)), ("gate", (18944, 3584)), ("down", (3584, 18944))):
    w = torch.randn(n, k, device="cuda") * 0.02
    weights[label] = (nvfp4.prepare(*nvfp4_quantize_reference(w)), w.bfloat16())

p, _ = weights["o"]
g = torch.randn(128, 3584, device="cuda", dtype=torch.bfloat16)
for path, name in (("wgmma", "jit"), ("wgmma", "cached"), ("swap", "-"), ("wgmma", "jit"), ("wgmma", "cached")):
    for _ in range(20):
        call(g, p, path, name)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(300):
        call(g, p, path, name)
    torch.cuda.synchronize()
    print(f"o M=128 {path} {name}: {(time.perf_counter() - t0) / 300 * 1e6:.1f} us a call (300 eager calls, wall)",
          flush=True)

for label, (p, wb) in weights.items():
    for m in (64, 128, 256):
        g = torch.randn(m, p.n, device="cuda", dtype=torch.bfloat16)
        res = {}
        for path, name in (("swap", "-"), ("wgmma", "jit"), ("wgmma", "cached"), ("deq", "-")):
            f = lambda: call(g, p, path, name)
            f()
            torch.cuda.synchronize()
            eager = triton.testing.do_bench(f, warmup=5, rep=25) * 1e3
            graph = triton.testing.do_bench_cudagraph(f, rep=20) * 1e3 if name != "jit" else float("nan")
            res[f"{path}/{name}" if path == "wgmma" else path] = (eager, graph)
        fp4_wgmma_t.launch = NEW
        bf = triton.testing.do_bench(lambda: g @ wb, warmup=5, rep=25) * 1e3
        chosen = L._choose_path_t(g, p)
        print(f"{label} {p.n}x{p.k} M={m} bf16 eager {bf:.1f} | "
              + " | ".join(f"{k_} eager {e:.1f} graph {gr:.1f}" for k_, (e, gr) in res.items())
              + f" | dispatch takes {chosen}", flush=True)
