"""cuconv: fast GPU convolution for the NumPy / CuPy world, with no torch dependency.

>>> import cuconv
>>> y = cuconv.conv2d(x, w, padding="same", activation="relu")   # doctest: +SKIP

Public API: :func:`conv2d`, :func:`conv3d`, :func:`explain`, gradients and transposed convolution
(:mod:`cuconv.grad`: :func:`conv2d_input_grad`, :func:`conv2d_weight_grad`, :func:`conv_transpose2d` and
their 3-D forms), :mod:`cuconv.reference` (the float64
oracle), ``overrides`` (force a tile / sub-path for tests and tuning), :func:`autotune` (measure each
problem's candidate kernels and tiles once and run the fastest), :class:`ConvProblem`. CuPy is imported lazily; ``import cuconv`` needs only NumPy and
ml_dtypes.
"""

from . import reference  # noqa: F401
from .api import conv2d, conv3d, explain
from .autotune import autotune
from .compiler import clear_cache
from .conv_plan import ConvPlan, plan_conv2d, plan_conv3d
from .dispatch import Explanation, KernelDeclined, kernels
from .grad import (GradExplanation, conv2d_input_grad, conv2d_weight_grad, conv3d_input_grad, conv3d_weight_grad,
                   conv_transpose2d, conv_transpose3d, conv_transpose_output_shape, explain_input_grad,
                   explain_transpose, explain_weight_grad)
from .overrides import Overrides, overrides
from .matmul import matmul
from .precompile import precompile
from .problem import ConvProblem, Epilogue
from .scratch import release_scratch

__version__ = "0.1.0"


def __getattr__(name):
    """``cuconv.dask`` on first use: dask is an optional dependency, imported only by that module."""
    if name == "dask":
        import importlib
        return importlib.import_module(".dask", __name__)
    raise AttributeError(f"module 'cuconv' has no attribute {name!r}")

__all__ = ["conv2d", "conv3d", "explain", "conv2d_input_grad", "conv3d_input_grad", "conv2d_weight_grad",
           "conv3d_weight_grad", "conv_transpose2d", "conv_transpose3d", "conv_transpose_output_shape",
           "explain_input_grad", "explain_weight_grad", "explain_transpose", "GradExplanation", "plan_conv2d", "plan_conv3d", "ConvPlan", "precompile", "matmul", "clear_cache", "release_scratch", "reference", "ConvProblem", "Epilogue", "Explanation",
           "KernelDeclined", "kernels", "overrides", "Overrides", "autotune", "__version__"]
