import math, sys
import cupy as cp, numpy as np
import cuconv
from cuconv.bench import _time
from cuconv.backends.hopper_tma import tile_settings, STAGES
shapes = [(64,1024,14,14,256,1,0),(64,256,14,14,256,3,1),(2,128,512,512,128,3,1),(64,64,56,56,64,1,0),(64,64,56,56,256,1,0),
          (64,64,56,56,64,3,1),(64,128,28,28,128,3,1),(4,256,256,256,256,3,1),(64,512,7,7,512,3,1)]
for (N,C,H,W,K,f,p) in shapes:
    sets = 4
    xs = [cp.random.standard_normal((N,H,W,C), dtype=cp.float32).astype(cp.float16) for _ in range(sets)]
    w = (cp.random.standard_normal((K,f,f,C), dtype=cp.float32) / math.sqrt(f*f*C)).astype(cp.float16)
    P = H + 2*p - f + 1
    outs = [cp.empty((N,P,P,K), cp.float16) for _ in range(sets)]
    flops = 2*N*P*P*K*f*f*C
    auto = cuconv.explain(xs[0], w, padding=p).detail.split(":")[0]
    res = []
    for bn in sorted(STAGES):
        with tile_settings(block_n=bn, cluster=1):
            ms = _time(lambda i: cuconv.conv2d(xs[i], w, padding=p, out=outs[i]), sets, 30)
        res.append(f"{bn}:{ms*1e3:.1f}us/{flops/ms/1e9:.0f}TF")
    print(f"N{N} C{C} {H}x{W} K{K} {f}x{f} auto={auto} ", " ".join(res), flush=True)
