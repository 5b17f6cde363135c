"""The HIP depthwise kernel (kernels_hip/depthwise/) compiles for gfx942 (and gfx90a), and its ISA holds
what the design says. No AMD GPU is needed: clang-19 compiles device code only and prints the ISA (the
command line is tests/test_cdna3_compile.py's ``compile_isa``).

Variants: the ones ``cdna3_depthwise`` plans for network layers and edge cases (3x3 stride 1 and 2, 5x5,
7x7, fp16 / bf16 / fp32, channel multiplier 2 and 3, odd C, dilation, conv3d), named and defined by
:func:`cuconv.backends.depthwise.variants.dw_variant`. For each:

* the entry point is the name the host launches, and ``cdna3_depthwise`` plans the problem on a model
  gfx942 device (the variant is one the kernel runs, its tile fits the 64 KiB of LDS);
* no scratch: private segment 0, no ``scratch_`` / ``buffer_store`` instruction, no AGPR copies
  (``v_accvgpr_*``: this kernel has no MFMA, so an AGPR use would be a spill), no call;
* the tile copy: ``buffer_load_<width> ... offen`` of the copy unit's width (VIN x element bytes; a
  batch of them, no other buffer load), each written by a ``ds_write`` of that width, and no
  ``... lds`` DMA form;
* the compute: ``ds_read`` (``ds_read_b128`` for a 16-byte channel vector), no ``flat_`` access (every
  pointer resolved to LDS, global or buffer), at least the S x QT x VEC fp32 multiply-adds of one
  filter row (``v_pk_fma_f32`` counts two);
* the epilogue: ``global_store`` of the VEC x element-byte width only (``global_store_dwordx4`` for
  16-byte vectors);
* two barriers (before and after the tile copy).

``test_resources_table`` prints VGPRs, SGPRs and the LDS each variant launches with (``pytest -s``).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cuconv.backends.cdna3.depthwise import DW_HIP_SOURCE, Cdna3DepthwiseKernel, hip_dw_config
from cuconv.backends.depthwise.variants import dw_variant
from cuconv.device import DeviceInfo
from cuconv.overrides import Overrides

from geometry import problem2d, problem3d
from test_cdna3_compile import CLANG, HIP_DIR, compile_isa, functions, scratch_size

pytestmark = pytest.mark.skipif(
    CLANG is None, reason="clang-19 not found (CI: apt-get install -y clang-19); the HIP ISA checks need it")

MI300 = DeviceInfo(kind="hip", index=0, name="MI300X", arch="gfx942", sm_count=304)

PROBLEMS = {
    "3x3_s1_bf16": problem2d(N=32, H=56, W=56, C=144, K=144, groups=144),
    "3x3_s1_f16": problem2d(N=32, H=56, W=56, C=144, K=144, groups=144, dtype="float16"),
    "3x3_s1_f32": problem2d(N=32, H=56, W=56, C=144, K=144, groups=144, dtype="float32"),
    "3x3_s2_f16": problem2d(N=32, H=56, W=56, C=144, K=144, stride=2, groups=144, dtype="float16"),
    "3x3_s2_f32": problem2d(N=32, H=28, W=28, C=240, K=240, stride=2, groups=240, dtype="float32"),
    "5x5_s1_bf16": problem2d(N=32, H=28, W=28, C=240, K=240, R=5, S=5, padding=2, groups=240),
    "5x5_s2_f16": problem2d(N=32, H=14, W=14, C=672, K=672, R=5, S=5, stride=2, padding=2, groups=672,
                            dtype="float16"),
    "7x7_s1_bf16": problem2d(N=32, H=56, W=56, C=96, K=96, R=7, S=7, padding=3, groups=96),
    "7x7_s1_f32": problem2d(N=32, H=56, W=56, C=96, K=96, R=7, S=7, padding=3, groups=96, dtype="float32"),
    "3x3_odd_c_bf16": problem2d(C=7, K=7, groups=7),
    "3x3_odd_c_f32": problem2d(C=7, K=7, groups=7, dtype="float32"),
    "3x3_mult2_bf16": problem2d(C=32, K=64, groups=32),
    "3x3_mult2_f32": problem2d(C=30, K=60, groups=30, dtype="float32"),
    "3x3_mult3_dil2": problem2d(C=16, K=48, groups=16, dilation=2, padding=2),
    "3x3x3_bf16": problem3d(C=64, K=64, groups=64),
}
GFX90A = ("3x3_s1_bf16", "7x7_s1_f32", "3x3_odd_c_bf16", "3x3_mult2_bf16")
BUILDS = [(k, "gfx942") for k in sorted(PROBLEMS)] + [(k, "gfx90a") for k in GFX90A]

_LOAD = {16: "buffer_load_dwordx4", 8: "buffer_load_dwordx2", 4: "buffer_load_dword", 2: "buffer_load_ushort"}
_DS_WRITE = {16: "ds_write_b128", 8: "ds_write_b64", 4: "ds_write_b32", 2: "ds_write_b16"}
_STORE = {16: "global_store_dwordx4", 8: "global_store_dwordx2", 4: "global_store_dword", 2: "global_store_short"}


def _variant(key):
    p = PROBLEMS[key]
    cfg = hip_dw_config(p, MI300)
    name, defines = dw_variant(p, cfg)
    return p, cfg, name, defines


@pytest.fixture(scope="module")
def isas():
    src = HIP_DIR / DW_HIP_SOURCE
    with ThreadPoolExecutor(max_workers=2) as pool:  # CI has 2 cores; ~1 s a build
        out = list(pool.map(lambda b: compile_isa(src, b[1], _variant(b[0])[3]), BUILDS))
    return dict(zip(BUILDS, out))


def _mnemonics(body: str):
    return [m.group(1) for m in re.finditer(r"^\s+([a-z][a-z0-9_]*)\b", body, re.M)]


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: f"{b[1]}-{b[0]}")
def test_variant_isa(isas, build):
    key, arch = build
    p, cfg, name, _ = _variant(key)
    assert Cdna3DepthwiseKernel().plan(p, MI300, Overrides()), f"cdna3_depthwise does not plan {key}"
    isa = isas[build]
    funcs = functions(isa)
    assert list(funcs) == [name], f"expected exactly the kernel {name}, found {list(funcs)}"
    body = funcs[name]
    ops = _mnemonics(body)

    # no scratch, no spill of any kind, no call
    assert scratch_size(isa, name) == 0, "the kernel uses scratch memory"
    for op in ops:
        assert not op.startswith(("scratch_", "buffer_store", "v_accvgpr", "flat_")), f"{op} in {name}"
    assert "s_swappc_b64" not in ops

    # the tile copy: buffer loads of one unit each, ds_writes of the same width
    unit = cfg.vin * p.itemsize
    loads = [op for op in ops if op.startswith("buffer_load")]
    assert loads and set(loads) == {_LOAD[unit]}, f"buffer loads {sorted(set(loads))}, expected {_LOAD[unit]}"
    assert len(loads) >= (4 if unit >= 8 else 8), "the copy batch is not unrolled"
    assert not re.search(r"^\s+buffer_load_\w+.*\blds\b", body, re.M), "an LDS-DMA load in the VGPR copy path"
    assert _DS_WRITE[unit] in ops

    # the compute: LDS reads, fp32 multiply-adds of at least one filter row (R stays a loop)
    vec_bytes = cfg.vec * p.itemsize
    assert any(op.startswith("ds_read") for op in ops)
    if cfg.mult == 1 and vec_bytes == 16:
        assert "ds_read_b128" in ops
    S = p.filter_spatial[-1]
    fmas = sum(op in ("v_fma_f32", "v_fmac_f32_e32", "v_fmac_f32_e64", "v_fmamk_f32", "v_fmaak_f32") for op in ops) \
        + 2 * ops.count("v_pk_fma_f32")
    assert fmas >= S * cfg.qt * cfg.vec, f"{fmas} fp32 multiply-adds, one filter row is {S * cfg.qt * cfg.vec}"

    # the epilogue: stores of one channel vector each
    stores = {op for op in ops if op.startswith("global_store")}
    assert stores == {_STORE[vec_bytes]}, f"global stores {sorted(stores)}, expected {_STORE[vec_bytes]}"
    assert ops.count("s_barrier") == 2


def _resource(isa: str, name: str, key: str) -> int:
    m = re.search(rf"\.name:\s+{name}\b.*?\.{key}:\s+(\d+)", isa, re.S) or \
        re.search(rf"\.{key}:\s+(\d+).*?\.name:\s+{name}\b", isa, re.S)
    assert m, f"no .{key} for {name}"
    return int(m.group(1))


def test_resources_table(isas):
    """VGPRs stay under 256 (at most two waves per SIMD lost to registers); the LDS is dynamic (cfg.smem)."""
    lines = []
    for build in BUILDS:
        key, arch = build
        p, cfg, name, _ = _variant(key)
        isa = isas[build]
        vgpr, sgpr = _resource(isa, name, "vgpr_count"), _resource(isa, name, "sgpr_count")
        assert _resource(isa, name, "agpr_count") == 0
        assert _resource(isa, name, "group_segment_fixed_size") == 0  # all LDS is the launch's dynamic share
        assert vgpr <= 256
        lines.append(f"{arch} {key:16s} {name:48s} VGPR {vgpr:3d} SGPR {sgpr:3d} LDS {cfg.smem:6d} B "
                     f"work-items {cfg.threads}")
    print("\n" + "\n".join(lines))


def test_entry_compiles_with_its_defaults():
    """The entry file alone (its default defines: bf16 3x3) builds the default-named kernel."""
    funcs = functions(compile_isa(HIP_DIR / DW_HIP_SOURCE))
    assert list(funcs) == ["depthwise_fprop"]


def test_dtype_code_outside_the_three_is_refused():
    with pytest.raises(AssertionError, match="CUCONV_DTYPE must be 0"):
        compile_isa(Path(HIP_DIR / DW_HIP_SOURCE), "gfx942", {"CUCONV_DTYPE": 3})
