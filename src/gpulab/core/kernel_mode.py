"""GPU kernels in two forms, and the one switch that decides where they run.

The course writes its kernels in CUDA C: the ``NN_name.cu`` files beside this module, numbered in
the order the chapters teach them (:mod:`gpulab.kernels.cuda_c` compiles and launches them). The
book also writes kernels in Python with numba-cuda's ``@cuda.jit`` (:mod:`gpulab.kernels.numba_kernels`,
and the labs). Where both kinds run is decided here, once, when gpulab is imported:

- ``"gpu"``: a CUDA GPU is present. CUDA C is compiled by CuPy (with NVRTC) and launched on the GPU;
  numba kernels are compiled for the GPU.
- ``"simulator"``: no GPU (CI, a laptop, the book build). numba's CUDA simulator runs numba kernels
  on the CPU, one Python thread per CUDA thread, so a reader can follow a kernel without a GPU; CUDA C
  is compiled with NVRTC, so a broken kernel still fails, but not launched, and the pages draw
  recorded GPU runs instead.

``GPULAB_KERNELS=simulator`` forces the simulator on a GPU machine (to step through a kernel, say).
The device banner (:func:`gpulab.core.banner.banner`) ends with :func:`describe`, so every notebook says
which mode it runs in.
"""

from __future__ import annotations

import importlib.metadata
import os

import numpy as np
import torch

from gpulab.core import env

MODES = ("gpu", "simulator")


class MissingPackage(ImportError):
    """An optional package that this feature needs is not installed; the message says how to install it."""


def _resolve_mode() -> str:
    forced = os.environ.get("GPULAB_KERNELS", "").strip().lower()
    if forced not in ("", *MODES):
        raise ValueError(f"GPULAB_KERNELS: 'gpu' or 'simulator', got {forced!r}")
    if forced == "simulator" or not env.has_gpu():
        return "simulator"
    return "gpu"


MODE = _resolve_mode()
if MODE == "simulator":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # numba reads this once, when numba.cuda is first imported


def on_gpu() -> bool:
    """True when kernels run on a real GPU, False under the simulator (see the module's docstring)."""
    return MODE == "gpu"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe() -> str:
    """One line for the banner: where this notebook's kernels run, with which packages."""
    if on_gpu():
        cupy = next(filter(None, (_version(p) for p in ("cupy", "cupy-cuda13x", "cupy-cuda12x"))), None)
        numba = _version("numba-cuda") or _version("numba")
        return (f"Kernels: on the GPU (CUDA C through CuPy {cupy or 'not installed'}, "
                f"numba-cuda {numba or 'not installed'})")
    return "Kernels: numba's CUDA simulator on this CPU; CUDA C is compiled with NVRTC but not launched"


def numba_cuda():
    """The ``numba.cuda`` module, imported in the mode chosen above (real GPU or simulator).

    numba-cuda 0.30 registers an overload for ``np.row_stack`` at import, which NumPy 2.5 removed
    (an alias of ``np.vstack`` since NumPy 2.0); the alias is put back here, the one place gpulab
    imports numba.
    """
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
    try:
        from numba import cuda
    except ImportError as error:
        raise MissingPackage("numba kernels need numba-cuda: pip install numba-cuda") from error
    if ("simulator" in cuda.jit.__module__) != (MODE == "simulator"):
        raise RuntimeError(
            "numba.cuda was imported before gpulab.kernels, in the other mode; restart the kernel and "
            "import gpulab first")
    return cuda


def require_gpu(what: str) -> None:
    """Raise a ValueError naming ``what`` unless kernels run on a GPU: a simulator's time says nothing about one."""
    if not on_gpu():
        raise ValueError(f"{what}: times kernels, which needs a CUDA GPU; this run uses the simulator")


def device() -> torch.device:
    """Where a kernel's data lives: the GPU, or the CPU under the simulator (even on a GPU machine)."""
    return env.device() if on_gpu() else torch.device("cpu")


def device_array(tensor: torch.Tensor):
    """``tensor`` as a numba kernel argument, sharing its memory (no copy).

    On the GPU a CUDA tensor becomes a numba device array; under the simulator a CPU tensor becomes
    the NumPy array the simulator expects.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor: a torch.Tensor, got {type(tensor).__name__}")
    if on_gpu():
        if tensor.device.type != "cuda":
            raise ValueError(f"tensor: kernels run on the GPU, but this tensor is on {tensor.device}")
        return numba_cuda().as_cuda_array(tensor.detach())
    if tensor.device.type != "cpu":
        raise ValueError(f"tensor: the simulator runs on the CPU, but this tensor is on {tensor.device}")
    return tensor.detach().numpy()


def synchronize() -> None:
    """Wait for every kernel launched so far (launches are asynchronous on a GPU)."""
    if on_gpu():
        torch.cuda.synchronize()
