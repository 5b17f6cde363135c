"""The host side of the kernel ABI (cuconv/launch.py): the fast divisor, the 3-D geometry every
parameter struct starts from, and constants read from the kernel headers."""

import numpy as np
import pytest

from cuconv.launch import fast_divisor, geometry3d, header_constants

from geometry import problem2d, problem3d


@pytest.mark.parametrize("d", [1, 2, 3, 7, 56, 112, 3136, 12544, 2**20 + 1, 2**31 - 1])
def test_fast_divisor_divides_every_31_bit_index(d):
    """kernels_cu/common/fast_div.cuh's splits (pixel and tap indices): (umulhi(x, mul) + x) >> shr == x // d."""
    mul, shr = fast_divisor(d)
    assert 0 < mul < 2**32
    rng = np.random.default_rng(d)
    xs = np.concatenate([np.arange(0, min(4 * d + 5, 50000)), rng.integers(0, 2**31, 20000), [2**31 - 1, 2**31 - 1 - d]])
    xs = [int(v) for v in xs if v < 2**31]
    assert all(((((x * mul) >> 32) + x) >> shr) == x // d for x in xs)
    with pytest.raises(ValueError, match="d"):
        fast_divisor(0)


def test_fast_divisor_values():
    assert fast_divisor(1) == (1, 0) and fast_divisor(56) == (((1 << 32) * 8) // 56 + 1, 6)


def test_geometry3d_pads_conv2d_with_a_unit_depth():
    g = geometry3d(problem2d(N=2, H=9, W=11, R=3, S=5, stride=(2, 1), dilation=(1, 2), padding=((1, 2), (3, 0))))
    assert (g.D, g.O, g.T) == (1, 1, 1) and (g.H, g.W, g.R, g.S) == (9, 11, 3, 5)
    assert g.stride == (1, 2, 1) and g.dilation == (1, 1, 2) and g.pad == (0, 1, 3)
    p3 = problem3d(D=6, H=9, W=11, T=3, R=3, S=3, stride=(2, 1, 1), padding=((1, 0), (1, 1), (0, 0)))
    g3 = geometry3d(p3)
    assert (g3.D, g3.H, g3.W) == (6, 9, 11) and (g3.O, g3.P, g3.Q) == p3.out_spatial and g3.pad == (1, 1, 0)


def test_header_constants_are_the_sources_defines():
    """The host reads the Hopper shared-memory budget from kernels_cu/sm90/budget.cuh."""
    from pathlib import Path
    consts = header_constants("sm90/budget.cuh")
    text = (Path(__file__).resolve().parents[1] / "kernels_cu" / "sm90" / "budget.cuh").read_text()
    assert consts and all(f"#define {name}" in text for name in consts)
    assert consts["SM90_SMEM_LIMIT"] == 227 * 1024 and consts["SM90_BLOCK_K"] == 64
