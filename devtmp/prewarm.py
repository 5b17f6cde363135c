import sys, time
from concurrent.futures import ProcessPoolExecutor
from cuconv.backends.hopper_tma import COMPILE_VARIANTS
from cuconv.compiler import compile_cuda
def one(v):
    src, d, arch = v
    compile_cuda(src, arch, d)
    return 1
t = time.time()
with ProcessPoolExecutor(16) as ex:
    n = sum(ex.map(one, COMPILE_VARIANTS))
print("prewarmed", n, "variants in", round(time.time() - t), "s")
