"""What a benchmark run needs (CuPy, a GPU; torch optionally) and what it records about where it ran.

:func:`require_gpu` is the one gate of every suite: it names what is missing (CuPy not installed,
CuPy failing to import, no device or a driver error) in a :class:`Unavailable` error, which the
command line prints and turns into exit status :data:`EXIT_UNAVAILABLE`. :func:`torch_for_cudnn`
finds torch for the cuDNN comparison, or says why there is none; the benchmark then runs without it.
:func:`run_metadata` is the date, device, command and software versions each JSON result carries.
"""

from __future__ import annotations

import datetime
import os
import shlex
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

__all__ = ["EXIT_UNAVAILABLE", "Unavailable", "require_gpu", "torch_for_cudnn", "np_dtype", "command_line",
           "run_metadata"]

#: Exit status of a benchmark that cannot run here (CuPy or a GPU missing).
EXIT_UNAVAILABLE = 2

_INSTALL_HINT = "pip install 'cuconv[cuda13]' (or '[cuda12]') on a machine with an NVIDIA GPU"


class Unavailable(RuntimeError):
    """The benchmark cannot run on this machine; the message says what is missing."""


def require_gpu():
    """The :class:`cuconv.device.DeviceInfo` of the GPU the benchmark runs on.

    Raises :class:`Unavailable` naming the cause: CuPy not installed, CuPy failing to import, or
    no GPU visible (no device, or the CUDA driver's error, e.g. a driver older than CuPy's runtime).
    """
    try:
        import cupy as cp
    except ImportError as e:
        raise Unavailable(f"CuPy is not installed ({e}); the benchmark runs on a GPU through CuPy: "
                          f"{_INSTALL_HINT}") from None
    except Exception as e:  # a broken CUDA install can fail inside CuPy's import
        raise Unavailable(f"CuPy fails to import: {type(e).__name__}: {e}") from None
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError: no driver, insufficient driver, no device
        raise Unavailable(f"no GPU visible to CuPy: {type(e).__name__}: {e}") from None
    if count < 1:
        raise Unavailable("no GPU visible to CuPy: the CUDA runtime reports 0 devices "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    from cuconv.device import current_gpu
    dev = current_gpu()
    if dev is None:
        raise Unavailable("no GPU visible to CuPy")
    return dev


def torch_for_cudnn(disabled: bool = False) -> Tuple[Optional[object], str]:
    """``(torch, "")`` when torch imports and sees CUDA, else ``(None, why)``: the cuDNN comparison
    is optional, so the caller runs on without it and prints ``why``."""
    if disabled:
        return None, "cuDNN comparison off (--no-torch)"
    try:
        import torch
    except ImportError:
        return None, "torch is not installed: running without the cuDNN comparison (pip install torch to add it)"
    except Exception as e:
        return None, f"torch fails to import ({type(e).__name__}: {e}): running without the cuDNN comparison"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device (a CPU-only build?): running without the cuDNN comparison"
    return torch, ""


def np_dtype(name: str):
    """The NumPy dtype of a benchmark dtype name (``"bfloat16"`` through ml_dtypes, ``"float16"``,
    ``"float32"`` and ``"float64"``: the networks suite's rows of those)."""
    if name == "bfloat16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    if name in ("float16", "float32", "float64"):
        return np.dtype(name).type
    raise ValueError(f"dtype: expected 'bfloat16', 'float16', 'float32' or 'float64', got {name!r}")


def command_line(argv: Sequence[str], prog: str = "python -m cuconv.bench") -> str:
    """The command that reproduces a run: the ``CUCONV_SM90_*`` / ``CUCONV_SM80_*`` settings (those that change
    what runs; not the cache folder), ``prog`` and ``argv``."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
                   if k.startswith(("CUCONV_SM90_", "CUCONV_SM80_")))
    return " ".join(filter(None, [env, prog, shlex.join(list(argv))]))


def _versions() -> Dict[str, str]:
    out: Dict[str, str] = {}
    try:
        import cuconv
        out["cuconv"] = cuconv.__version__
        import cupy as cp
        out["cupy"] = cp.__version__
        out["cuda_runtime"] = str(cp.cuda.runtime.runtimeGetVersion())
        out["cuda_driver"] = str(cp.cuda.runtime.driverGetVersion())
    except Exception:  # versions describe a run; a missing one stops nothing
        pass
    try:
        import torch
        out["torch"] = torch.__version__
        out["cudnn"] = str(torch.backends.cudnn.version())
    except Exception:
        pass
    return out


def run_metadata(argv: Sequence[str], device: str) -> Dict[str, object]:
    """``date`` (UTC, ISO 8601), ``device``, ``command`` and ``software`` versions of a run."""
    date = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    return {"date": date, "device": device, "command": command_line(argv), "software": _versions()}
