import math
import cupy as cp
import cuconv
from cuconv.bench import _time
from cuconv.backends.hopper_tma import tile_settings
shapes = [(64,64,56,56,64,3,1),(64,64,56,56,256,1,0),(64,64,56,56,64,1,0),(64,128,28,28,128,3,1),(64,128,56,56,128,3,2),
          (64,256,14,14,256,3,1),(64,1024,14,14,256,1,0),(64,512,7,7,512,3,1),(2,128,512,512,128,3,1),(8,320,64,64,320,3,1)]
for (N,C,H,W,K,f,st) in shapes:
    p = f // 2
    sets = 4
    xs = [cp.random.standard_normal((N,H,W,C), dtype=cp.float32).astype(cp.float16) for _ in range(sets)]
    w = (cp.random.standard_normal((K,f,f,C), dtype=cp.float32) / math.sqrt(f*f*C)).astype(cp.float16)
    P = (H + 2*p - f) // st + 1
    outs = [cp.empty((N,P,P,K), cp.float16) for _ in range(sets)]
    flops = 2*N*P*P*K*f*f*C
    res = []
    for pp in (False, True):
        for bn in (None, 64, 128):
            if bn is not None and bn > K: continue
            with tile_settings(pingpong=pp, block_n=bn):
                d = cuconv.explain(xs[0], w, padding=p, stride=st).detail.split(":")[0].replace("conv2d_fprop_sm90_tma_", "")
                ms = _time(lambda i: cuconv.conv2d(xs[i], w, padding=p, stride=st, out=outs[i]), sets, 30)
            res.append(f"{d}={ms*1e3:.1f}us")
    print(f"N{N} C{C} {H}x{W} K{K} {f}x{f} s{st}: ", " ".join(res), flush=True)
