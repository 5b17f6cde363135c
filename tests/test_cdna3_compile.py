"""Every kernels_hip/ source compiles for gfx942 (and gfx90a), and the ISA holds what the design says.

No AMD GPU is needed: Debian's clang-19 compiles device code only and prints the ISA::

    clang-19 -x hip --offload-arch=gfx942 --cuda-device-only -nogpulib -nogpuinc -O3 -S -o - FILE

(-nogpuinc: no HIP headers; kernels_hip/common/hip_min.h declares the little we need.) CI installs
the Debian package ``clang-19`` (it pulls in libclang-common-19-dev with the AMDGPU target).

What is checked, per kernel variant (cuconv.backends.cdna3.variants.all_variants, bf16 and fp16):

* the entry point exists under the name the Python side launches (cdna3.variants.kernel_name);
* the loads are ``buffer_load_dword ... offen lds``: exactly 3 load_tile sites (prologue, pong,
  ping) x 2 operands x 8 iterations = 48 per kernel, and no other buffer_load;
* the MFMA is there: ``v_mfma_f32_32x32x8_bf16`` / ``v_mfma_f32_32x32x8_f16``;
* no scratch (private segment 0): nothing spilled, no stack copies of the loader state;
* no integer division anywhere (see "divisions" below).

Divisions. LLVM expands a 32-bit unsigned division or remainder by a non-constant on AMDGPU into a
float-reciprocal sequence whose anchor is ``v_rcp_iflag_f32`` (v_cvt_f32_u32, v_rcp_iflag_f32,
v_mul_f32 0x4f7ffffe, v_cvt_u32_f32, then corrections); 64-bit divisions expand likewise or call
__udivdi3-style helpers (s_swappc). Our loaders divide with FastDivmod (mul_hi + shift, parameters
from the host), so the check is: no ``v_rcp_iflag_f32`` and no call (``s_swappc_b64``) in a kernel.
``probe_division_control`` (the per-lane decomposition with C's ``/`` and ``%``) must show
``v_rcp_iflag_f32``: that proves the detector sees a division when there is one.

Pointwise stream. The pointwise im2col loader must *be* the matmul loader: the probes
``probe_loader_im2col_pointwise`` and ``probe_loader_linear`` (same parameters, one half-tile each)
must compile to the same multiset of mnemonics (the same instructions; the scheduler may order the
kernel-argument loads differently because the two build their address plan through different
calls), with no division.
"""

from __future__ import annotations

import re
from collections import Counter
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuconv.backends.cdna3 import variants as cdna3

ROOT = Path(__file__).resolve().parent.parent
HIP_DIR = ROOT / "kernels_hip"
CLANG = shutil.which("clang-19")

pytestmark = pytest.mark.skipif(
    CLANG is None, reason="clang-19 not found (CI: apt-get install -y clang-19); the HIP ISA checks need it")

DIVISION_MARKERS = ("v_rcp_iflag_f32", "s_swappc_b64")
LDS_LOAD = re.compile(r"^\s*buffer_load_dword\s+v\d+,\s*s\[\d+:\d+\],\s*\S+\s+offen\s+lds\b", re.M)
ANY_BUFFER_LOAD = re.compile(r"^\s*buffer_load_\w+", re.M)
LOADS_PER_KERNEL = 3 * 2 * 8


def compile_isa(source: Path, arch: str = "gfx942", defines=None) -> str:
    cmd = [CLANG, "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-nogpulib", "-nogpuinc", "-O3",
           "-std=c++17", "-S", "-o", "-", f"-I{HIP_DIR}"]
    cmd += [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]
    cmd.append(str(source))
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    assert "warning" not in res.stderr, res.stderr
    return res.stdout


def functions(isa: str) -> dict:
    """{kernel name: its instruction lines} from clang's assembly listing."""
    out = {}
    for m in re.finditer(r"^(\w+):\s*;\s*@\1\s*$(.*?)^\s*s_endpgm", isa, re.S | re.M):
        out[m.group(1)] = m.group(2) + "\n\ts_endpgm\n"
    return out


def mnemonics(body: str):
    return [ln.split()[0] for ln in body.splitlines()
            if re.match(r"^\s+[a-z]", ln) and not ln.strip().startswith((";", "."))]


def scratch_size(isa: str, name: str) -> int:
    m = re.search(rf"\.amdhsa_kernel {name}\b.*?\.amdhsa_private_segment_fixed_size (\d+)", isa, re.S)
    assert m, f"no kernel descriptor for {name}"
    return int(m.group(1))


VARIANTS = cdna3.all_variants("bfloat16") + cdna3.all_variants("float16")
BUILDS = [(v, "gfx942") for v in VARIANTS] + [(v, "gfx90a") for v in cdna3.all_variants("bfloat16")[:4]]


@pytest.fixture(scope="module")
def entry_isa():
    src = HIP_DIR / cdna3.SOURCE
    with ThreadPoolExecutor(max_workers=2) as pool:  # CI has 2 cores; ~1 s a build
        isas = list(pool.map(lambda b: compile_isa(src, b[1], b[0].defines), BUILDS))
    return dict(zip(BUILDS, isas))


@pytest.fixture(scope="module")
def probe_isa():
    return functions(compile_isa(HIP_DIR / "cdna3" / "loader_probe.hip"))


def test_every_hip_source_compiles():
    """Every .hip file and every header on its own (headers must be self-contained)."""
    files = sorted(p for p in HIP_DIR.rglob("*") if p.suffix in (".hip", ".h"))
    assert files, "no sources under kernels_hip/"
    for f in files:
        if f.suffix == ".h":
            tmp = f"#include \"{f.relative_to(HIP_DIR).as_posix()}\"\n"
            res = subprocess.run([CLANG, "-x", "hip", "--offload-arch=gfx942", "--cuda-device-only", "-nogpulib",
                                  "-nogpuinc", "-O3", "-std=c++17", "-fsyntax-only", f"-I{HIP_DIR}", "-"],
                                 input=tmp, capture_output=True, text=True)
            assert res.returncode == 0, f"{f}:\n{res.stderr}"
        else:
            compile_isa(f)


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: f"{b[1]}-{b[0].name}")
def test_entry_kernel_isa(entry_isa, build):
    variant, arch = build
    isa = entry_isa[build]
    funcs = functions(isa)
    name = cdna3.kernel_name(variant)
    assert list(funcs) == [name], f"expected exactly the kernel {name}, found {list(funcs)}"
    body = funcs[name]
    lds_loads = LDS_LOAD.findall(body)
    assert len(lds_loads) == LOADS_PER_KERNEL, f"{len(lds_loads)} buffer_load_dword ... lds, expected {LOADS_PER_KERNEL}"
    assert len(ANY_BUFFER_LOAD.findall(body)) == LOADS_PER_KERNEL, "a buffer_load without lds crept in"
    # gfx942 spells them v_mfma_f32_32x32x8_bf16 / _f16, gfx90a v_mfma_f32_32x32x8bf16_1k / 8f16
    mfma = r"v_mfma_f32_32x32x8_?bf16(_1k)?\b" if variant.dtype == "bfloat16" else r"v_mfma_f32_32x32x8_?f16\b"
    n_mfma = len(re.findall(mfma, body))
    assert n_mfma == 2 * 2 * 4 * 2, f"{n_mfma} x {mfma}, expected 32 (2x2 blocks x 4 k-steps x ping/pong)"
    assert "s_barrier" in body
    for marker in DIVISION_MARKERS:
        assert marker not in body, f"{marker} in {name}: an integer division (or a call) in the kernel"
    assert scratch_size(isa, name) == 0, "the kernel uses scratch memory"


def test_pointwise_loader_is_the_matmul_loader(probe_isa):
    linear = mnemonics(probe_isa["probe_loader_linear"])
    pointwise = mnemonics(probe_isa["probe_loader_im2col_pointwise"])
    assert Counter(pointwise) == Counter(linear), \
        f"the pointwise im2col loader's instructions differ from the linear loader's: {Counter(pointwise) - Counter(linear)} " \
        f"extra, {Counter(linear) - Counter(pointwise)} missing"
    assert sum(m == "buffer_load_dword" for m in pointwise) == 8
    for marker in DIVISION_MARKERS:
        assert marker not in pointwise


@pytest.mark.parametrize("probe", ["probe_loader_im2col_uniform", "probe_loader_im2col_uniform_halo",
                                   "probe_loader_im2col_per_lane_halo"])
def test_im2col_loaders_have_one_lds_load_per_iteration_and_no_division(probe_isa, probe):
    body = probe_isa[probe]
    assert len(LDS_LOAD.findall(body)) == 8
    for marker in DIVISION_MARKERS:
        assert marker not in body, f"{marker} in {probe}"


def test_halo_flag_adds_only_selects(probe_isa):
    """Halo on adds compares/selects to the uniform loader; halo off has none of the sentinel selects."""
    plain = mnemonics(probe_isa["probe_loader_im2col_uniform"])
    halo = mnemonics(probe_isa["probe_loader_im2col_uniform_halo"])
    assert len(halo) > len(plain)
    assert plain.count("v_cndmask_b32_e32") + plain.count("v_cndmask_b32_e64") < \
        halo.count("v_cndmask_b32_e32") + halo.count("v_cndmask_b32_e64")


def test_division_detector_positive_control(probe_isa):
    assert "v_rcp_iflag_f32" in probe_isa["probe_division_control"]
