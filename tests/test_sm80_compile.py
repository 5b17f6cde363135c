"""The sm_80+ kernels compile (NVRTC, CPU) for sm_80 and sm_90a with zero spills, and the SASS holds
tensor-core MMAs (HMMA; tf32 ones for the float32 variants), ldmatrix and asynchronous global->shared
copies (LDGSTS) where the variant uses them (cuconv.backends.sm80.catalog.COMPILE_VARIANTS: every
path, both element types and the tf32 form, the 2-byte fallback, the pad pre-pass, the grouped kernel
and the matmul). No GPU needed.
"""

import subprocess

import pytest

from cuconv.backends.sm80.catalog import COMPILE_VARIANTS
from cuconv.backends.sm80.variants import GROUPED_SOURCE, PAD_SOURCE

from conftest import find_cuobjdump, nvrtc_available


needs_nvrtc = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC (cuda-bindings + nvidia-cuda-nvrtc) not installed")


@needs_nvrtc
@pytest.mark.parametrize("source,defines,arch", COMPILE_VARIANTS,
                         ids=[f"{d['CUCONV_KERNEL_NAME']}-{a}" for _, d, a in COMPILE_VARIANTS])
def test_compiles_without_spills_and_uses_tensor_cores(source, defines, arch):
    from cuconv.compiler import compile_cuda
    cubin, report = compile_cuda(source, arch, defines)
    main = report.function(defines["CUCONV_KERNEL_NAME"])
    assert report.spills == 0 and main.stack_frame == 0, report.log
    tool = find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    sass = subprocess.run([tool, "--dump-sass", cubin], capture_output=True, text=True, check=True).stdout
    if source == PAD_SOURCE:  # the channel-pad pre-pass: no MMA
        assert "HMMA" not in sass
        return
    if defines.get("CUCONV_TF32"):  # float32 as the 16-bit view: one m16n8k8 tf32 MMA per k16 step
        assert "HMMA.1688.F32.TF32" in sass and "HMMA.16816" not in sass, "no tf32 tensor-core MMA in the SASS"
    else:
        assert "HMMA.16816.F32" in sass, "no m16n8k16 tensor-core MMA in the SASS"
    if source == GROUPED_SOURCE:  # fragments from registers / ld.shared, no ldmatrix or cp.async
        assert "LDG.E.128" in sass, "the grouped_mma loads are 16-byte"
        return
    assert "LDSM" in sass, "no ldmatrix in the SASS"
    if defines["CUCONV_VEC_A"] > 1 or defines["CUCONV_VEC_B"] > 1:
        assert "LDGSTS" in sass, "no cp.async (LDGSTS) in the SASS"
