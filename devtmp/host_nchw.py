import time, cupy as cp, numpy as np, ml_dtypes, cuconv
def per_call(fn, n=2000):
    for _ in range(50): fn()
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    dt = (time.perf_counter() - t) / n
    cp.cuda.Device().synchronize()
    return dt * 1e6
bf = ml_dtypes.bfloat16
x = cp.asarray(np.random.rand(1, 8, 8, 64).astype(bf)); w = cp.asarray(np.random.rand(64, 3, 3, 64).astype(bf))
xc = cp.ascontiguousarray(x.transpose(0, 3, 1, 2)); wc = cp.ascontiguousarray(w.transpose(0, 3, 1, 2))
o = cp.empty((1, 8, 8, 64), bf); oc = cp.empty((1, 64, 8, 8), bf)
print("empty", per_call(lambda: cp.empty((1, 64, 8, 8), bf)))
print("NHWC out=", per_call(lambda: cuconv.conv2d(x, w, padding=1, out=o)))
print("NHWC", per_call(lambda: cuconv.conv2d(x, w, padding=1)))
print("NCHW out=", per_call(lambda: cuconv.conv2d(xc, wc, padding=1, layout="NCHW", out=oc)))
print("NCHW", per_call(lambda: cuconv.conv2d(xc, wc, padding=1, layout="NCHW")))
p = cuconv.plan_conv2d(xc, wc, padding=1, layout="NCHW")
print("NCHW plan out=", per_call(lambda: p(xc, wc, out=oc)))
from cuconv.layout import to_channels_last
print("one transpose to scratch", per_call(lambda: to_channels_last(xc, True, cp, "x")))
