import cupy as cp, numpy as np, ml_dtypes, sys
from cuconv.layout import to_channels_last, to_channels_first
def t(fn, n=50):
    fn(); cp.cuda.Device().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(n): fn()
    b.record(); b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / n
for dt, shape in [(ml_dtypes.bfloat16, (32, 256, 56, 56)), (ml_dtypes.bfloat16, (32, 64, 112, 112)),
                  (ml_dtypes.bfloat16, (1, 128, 512, 512)), (ml_dtypes.bfloat16, (32, 2048, 7, 7)),
                  (ml_dtypes.bfloat16, (32, 3, 224, 224)), (np.float32, (32, 256, 56, 56)),
                  (np.float16, (32, 255, 56, 56))]:
    x = cp.asarray(np.random.rand(*shape).astype(dt))
    nb = 2 * x.nbytes
    ms1 = t(lambda: to_channels_last(x, True, cp, "x"))
    y = to_channels_last(x, True, cp)
    ms2 = t(lambda: to_channels_first(y, cp))
    ms3 = t(lambda: cp.ascontiguousarray(cp.moveaxis(x, 1, -1)))
    print(f"{np.dtype(dt).name:9s} {str(shape):22s} to_last {ms1*1e3:7.1f}us {nb/ms1/1e9:5.2f}TB/s  to_first {ms2*1e3:7.1f}us {nb/ms2/1e9:5.2f}TB/s  cupy {ms3*1e3:7.1f}us {nb/ms3/1e9:5.2f}TB/s", flush=True)
