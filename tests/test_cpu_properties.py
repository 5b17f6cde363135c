"""The CPU kernel against the float64 reference over drawn geometry (2-D and 3-D)."""

from hypothesis import given

from geometry import cases, check_case


@given(cases(nd=2))
def test_conv2d_cpu_matches_reference(case):
    check_case(case)


@given(cases(nd=3, max_channels=8, max_spatial=8))
def test_conv3d_cpu_matches_reference(case):
    check_case(case)


@given(cases(nd=2, epilogue=True))
def test_conv2d_cpu_out_and_in_place_residual(case):
    check_case(case, poison=True)
    check_case(case, in_place=True)
