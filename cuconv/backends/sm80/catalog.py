"""Representative sm80 variants for the CPU compile test (tests/test_sm80_compile.py): every sub-path,
the narrow and the widest tile, both element types and the tf32 form, the 2-byte fallback, the pad
pre-pass, the grouped kernel and the matmul, for sm_80 and sm_90a."""

from __future__ import annotations

from ...models.loader import SUBPATHS, subpath_ok
from ...problem import ConvProblem, sixteen_bit_problem
from .pad import pad_plan
from .variants import (BLOCK_K, CONV_SOURCE, GROUPED_SOURCE, MATMUL_SOURCE, PAD_SOURCE, conv_variant, grouped_variant,
                       matmul_variant, pad_variant)

__all__ = ["COMPILE_VARIANTS"]


def _compile_variants():
    """Representative (source, defines, arch) triples for the CPU compile test (tests/test_compile.py):
    every sub-path, the narrow and the widest tile, both element types, the 2-byte fallback."""
    out = []

    def conv(c, k, filt, pad, dtype="bfloat16", groups=1, tf32=False):
        p = ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=k, filter_spatial=filt,
                               stride=1, dilation=1, padding=pad, groups=groups, dtype=dtype, layout="NHWC")
        if tf32:  # the 16-bit view of float32 data (sm80_tf32)
            p = sixteen_bit_problem(p, 2 * c)
        sub = next(s for s in SUBPATHS if subpath_ok(p, s, BLOCK_K))
        return conv_variant(p, sub, tf32=tf32)[2]

    def grouped(c, groups, dtype="bfloat16", filt=(3, 3)):
        return ConvProblem.create(nd=2, batch=2, in_spatial=(16, 16), channels=c, out_channels=c, filter_spatial=filt,
                                  stride=1, dilation=1, padding=1, groups=groups, dtype=dtype, layout="NHWC")

    def stem(stride):
        return pad_plan(ConvProblem.create(
            nd=2, batch=2, in_spatial=(16, 16), channels=3, out_channels=64, filter_spatial=(7, 7), stride=stride,
            dilation=1, padding=3, groups=1, dtype="bfloat16", layout="NHWC"))

    defs = [(CONV_SOURCE, conv(64, 256, (3, 3), 1)),               # uniform, 128x256
            (CONV_SOURCE, conv(3, 64, (7, 7), 3)),                 # per-lane, 2-byte copies (stem)
            (CONV_SOURCE, conv(128, 128, (3, 3), 1, groups=32)),   # per-lane, 8-byte copies, 128x16
            (CONV_SOURCE, conv(6, 64, (3, 3), 1)),                 # per-lane, 4-byte copies, 128x64
            (CONV_SOURCE, conv(64, 128, (1, 1), 0, "float16")),    # pointwise, fp16
            (CONV_SOURCE, conv(64, 256, (3, 3), 1, "float32", tf32=True)),              # tf32: uniform, 128x256
            (CONV_SOURCE, conv(3, 64, (7, 7), 3, "float32", tf32=True)),                # tf32: per-lane, 4-byte copies
            (CONV_SOURCE, conv(128, 128, (3, 3), 1, "float32", groups=32, tf32=True)),  # tf32: grouped, per-lane
            (CONV_SOURCE, conv(64, 96, (1, 1), 0, "float32", tf32=True)),               # tf32: pointwise
            # pad_channels: the stem folded (2 pixels of C padded to 4), and a stride-1 7x7 on C padded to 4
            (CONV_SOURCE, conv_variant(stem(2).kernel_problem, "per_lane", w_ld=stem(2).w_ld)[2]),
            (CONV_SOURCE, conv_variant(stem(1).kernel_problem, "per_lane", w_ld=stem(1).w_ld)[2]),
            (PAD_SOURCE, pad_variant(4)[1]),
            (PAD_SOURCE, pad_variant(8)[1]),
            (GROUPED_SOURCE, grouped_variant(grouped(128, 32))[2]),            # ResNeXt 32x4d
            (GROUPED_SOURCE, grouped_variant(grouped(64, 64, "float16"))[2]),  # depthwise, fp16
            (GROUPED_SOURCE, grouped_variant(grouped(8, 8, filt=(7, 7)))[2]),  # depthwise 7x7
            (MATMUL_SOURCE, matmul_variant("bfloat16", 8192, 8192, 8192)[2]),
            (MATMUL_SOURCE, matmul_variant("float16", 7, 13, 5)[2])]
    for arch in ("sm_80", "sm_90a"):
        out += [(src, d, arch) for src, d in defs]
    return out


COMPILE_VARIANTS = _compile_variants()
