import time, cProfile, pstats, io, sys
import numpy as np, cupy as cp
import cuconv
from cuconv import api, dispatch
from cuconv.backends import hopper_tma

def per_call(fn, n=3000):
    for _ in range(50): fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    return (t1 - t0) / n * 1e6

x = cp.random.standard_normal((1, 8, 8, 64)).astype(cp.float16)
w = cp.random.standard_normal((64, 3, 3, 64)).astype(cp.float16)
out = cp.empty((1, 8, 8, 64), cp.float16)
print("conv2d call us", per_call(lambda: cuconv.conv2d(x, w, padding=1)))
print("conv2d call out= us", per_call(lambda: cuconv.conv2d(x, w, padding=1, out=out)))
call = api._prepare(2, x, w, None, 1, 1, 1, 1, "NHWC", None, 1.0, 1.0, None, None)
print("_prepare us", per_call(lambda: api._prepare(2, x, w, None, 1, 1, 1, 1, "NHWC", None, 1.0, 1.0, None, None)))
print("_select us", per_call(lambda: api._select(call, None, None)))
k, _ = api._select(call, None, None)
print("kernel", k.name)
print("k.run us", per_call(lambda: k.run(call.problem, call.x, call.w, None, None, call.out_native)))
launch = next(iter(hopper_tma._LAUNCHES.values()))
ptr = out.data.ptr
print("raw launch us", per_call(lambda: launch(ptr)))
ref = cuconv.reference.conv2d_reference(x.get(), w.get(), padding=1) if hasattr(cuconv.reference, "conv2d_reference") else None
o1 = cuconv.conv2d(x, w, padding=1)
print("check vs numpy", float(abs(o1.get().astype(np.float32) - cuconv.conv2d(x.get(), w.get(), padding=1).astype(np.float32)).max()))
print("cp.empty us", per_call(lambda: cp.empty((1, 8, 8, 64), cp.float16)))
print("Device() ctx us", per_call(lambda: x.device.__enter__() and None))
def devctx():
    with x.device:
        pass
print("with device us", per_call(devctx))
print("Device().id us", per_call(lambda: cp.cuda.Device().id))
print("hash problem us", per_call(lambda: hash(call.problem)))
try:
    import torch
    xt = torch.randn(1, 64, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    wt = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    print("torch conv2d us", per_call(lambda: torch.nn.functional.conv2d(xt, wt, padding=1)))
except Exception as e:
    print("torch", e)
import gc
gc.disable()
print("conv2d call gc off us", per_call(lambda: cuconv.conv2d(x, w, padding=1)))
gc.enable()
keep = []
def call_keep():
    keep.append(cuconv.conv2d(x, w, padding=1))
    if len(keep) > 100: keep.clear()
print("conv2d call keep us", per_call(call_keep))
def stages(n=3000):
    import time as T
    acc = [0.0] * 5
    for _ in range(n):
        t0 = T.perf_counter()
        call = api._prepare(2, x, w, None, 1, 1, 1, 1, "NHWC", None, 1.0, 1.0, None, None)
        t1 = T.perf_counter()
        k, _ = api._select(call, None, None)
        t2 = T.perf_counter()
        with call.x.device:
            k.run(call.problem, call.x, call.w, call.bias, call.residual, call.out_native)
        t3 = T.perf_counter()
        r = call.out_native
        del call, r
        t4 = T.perf_counter()
        for i, v in enumerate((t1 - t0, t2 - t1, t3 - t2, t4 - t3)): acc[i] += v
    return [a / n * 1e6 for a in acc]
stages(200)
print("stages prepare/select/run/drop us", stages())
import sys; sys.exit(0) if False else None
pr = cProfile.Profile()
pr.enable()
for _ in range(3000): cuconv.conv2d(x, w, padding=1)
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(0)
print(s.getvalue())
from cuconv.bench import host_overhead_us
print("bench host_overhead_us", host_overhead_us())
print("bench host_overhead_us no torch", host_overhead_us(with_torch=False))
x2 = cp.random.standard_normal((1, 8, 8, 64), dtype=cp.float32).astype(cp.float16)
w2 = cp.random.standard_normal((64, 3, 3, 64), dtype=cp.float32).astype(cp.float16)
out2 = cp.empty((1, 8, 8, 64), dtype=cp.float16)
print("fresh arrays out= us", per_call(lambda: cuconv.conv2d(x2, w2, padding=1, out=out2)))
print(cuconv.explain(x2, w2, padding=1))
