"""The course's CUDA C kernels: find them, compile them, report their resources, launch them.

Each ``NN_name.cu`` file in this folder holds one step of the course, numbered in teaching order.
Kernels are declared ``extern "C"`` so that their names survive compilation unmangled.

- :func:`compile_report` compiles a file with NVRTC (NVIDIA's runtime compiler, which needs no GPU)
  and returns what the assembler reports per kernel: registers per thread, shared memory, spills.
  CI calls it on every file, so a kernel that no longer compiles fails the tests on a CPU.
- :func:`launch` runs a kernel on the GPU through CuPy, taking torch tensors as arguments.

A file may leave constants to the compiler's command line (``#ifndef BM / #define BM 128``): every
function here takes ``defines={"BM": 64}``, which compiles the file with ``-DBM=64``, so that a sweep
can try variants of one kernel.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from gpulab.core import env, kernel_mode, printing, timing

FOLDER = Path(__file__).parent
OPTIONS = ("-std=c++17",)
DEFAULT_ARCH = "sm_90"  # compiled for Hopper when no GPU says otherwise
INT32 = (-2**31, 2**31 - 1)
DEFAULT_DYNAMIC_SHARED_BYTES = 48 * 1024  # what a launch may ask for without raising the kernel's limit


class CompileError(RuntimeError):
    """NVRTC rejected a kernel file; the message carries the compiler's log."""


@dataclass(frozen=True)
class Resources:
    """What the assembler reports for one kernel: per-thread registers, per-block shared memory, spills."""

    kernel: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores_bytes: int
    spill_loads_bytes: int


@dataclass(frozen=True)
class CompileReport:
    file: str
    arch: str
    resources: dict[str, Resources]
    log: str


def files() -> list[Path]:
    """Every kernel file, in course order."""
    return sorted(FOLDER.glob("*.cu"))


def path(name: str) -> Path:
    """The file of kernel step ``name``: ``"04_saxpy"`` or ``"04_saxpy.cu"``."""
    stem = name.removesuffix(".cu")
    found = FOLDER / f"{stem}.cu"
    if not found.is_file():
        known = ", ".join(p.stem for p in files())
        raise ValueError(f"name: no kernel file {stem!r}; the files are {known}")
    return found


def source(name: str) -> str:
    return path(name).read_text()


def show(name: str) -> None:
    """Display the source of kernel file ``name`` with syntax highlighting."""
    printing.show_code(source(name), "cuda")


def device_arch() -> str:
    """``sm_XY`` of the GPU present, or :data:`DEFAULT_ARCH` without one."""
    if kernel_mode.on_gpu():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return DEFAULT_ARCH


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:
        raise kernel_mode.MissingPackage(
            "compiling CUDA C without CuPy needs NVRTC's Python bindings: "
            "pip install cuda-bindings nvidia-cuda-nvrtc") from error
    return nvrtc


def _checked(result: tuple, what: str):
    error, *values = result
    if int(error) != 0:
        raise CompileError(f"NVRTC {what}: {error}")
    return values[0] if len(values) == 1 else values


def _number(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else 0


def parse_resources(log: str) -> dict[str, Resources]:
    """The per-kernel resource lines of a ``ptxas -v`` log, keyed by kernel name."""
    found: dict[str, Resources] = {}
    for part in re.split(r"ptxas info\s*: Compiling entry function ", log)[1:]:
        name = re.match(r"'([^']+)'", part).group(1)
        found[name] = Resources(
            kernel=name,
            registers=_number(r"Used (\d+) registers", part),
            shared_bytes=_number(r"(\d+) bytes smem", part),
            stack_bytes=_number(r"(\d+) bytes stack frame", part),
            spill_stores_bytes=_number(r"(\d+) bytes spill stores", part),
            spill_loads_bytes=_number(r"(\d+) bytes spill loads", part),
        )
    return found


Defines = tuple[tuple[str, int], ...]  # the hashable form of a ``defines`` mapping


def _defines(defines: Mapping[str, int] | None) -> Defines:
    items = tuple(sorted((defines or {}).items()))
    for key, value in items:
        if not (isinstance(key, str) and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key)):
            raise ValueError(f"defines: macro names are upper-case C identifiers, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"defines: {key} must be an int, got {value!r}")
    return items


def _options(defines: Defines) -> tuple[str, ...]:
    return (*OPTIONS, *(f"-D{key}={value}" for key, value in defines))


def compile_report(name: str, arch: str | None = None, defines: Mapping[str, int] | None = None) -> CompileReport:
    """Compile kernel file ``name`` with NVRTC for ``arch`` (default: this GPU's, else sm_90); raise CompileError.

    No GPU is needed: NVRTC is a library that turns CUDA C into machine code for a named architecture.
    A file is compiled once per architecture and source text: NVRTC 13.0 was seen to leave the
    assembler's report out of the log when the same program was compiled again in one process.
    """
    arch = arch or device_arch()
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        raise ValueError(f"arch: like 'sm_90', got {arch!r}")
    file = path(name)
    return _compiled(file, file.read_text(), arch, _defines(defines))


@cache
def _compiled(file: Path, text: str, arch: str, defines: Defines = ()) -> CompileReport:
    nvrtc = _nvrtc()
    program = _checked(nvrtc.nvrtcCreateProgram(text.encode(), file.name.encode(), 0, [], []), "create")
    try:
        options = [*(o.encode() for o in _options(defines)), f"--gpu-architecture={arch}".encode(),
                   b"--ptxas-options=-v"]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        size = _checked(nvrtc.nvrtcGetProgramLogSize(program), "log size")
        # A fresh, writable buffer: NVRTC writes the log into it. (b" " * size would not do: for an
        # empty log, size is 1, and b" " * 1 is Python's one shared b" ", which NVRTC would overwrite.)
        log = bytearray(size)
        _checked(nvrtc.nvrtcGetProgramLog(program, log), "log")
        log_text = bytes(log).decode(errors="replace").replace("\x00", "").rstrip()
        if int(status) != 0:
            what = " ".join((file.name, *_options(defines)[len(OPTIONS):]))
            raise CompileError(f"{what} does not compile for {arch}:\n{log_text}")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    resources = parse_resources(log_text)
    missing = [k for k in entry_points(text) if k not in resources]
    if missing and kernel_mode.on_gpu() and arch == device_arch():
        # NVRTC 13.0 was seen to leave the assembler's report out of the log inside a notebook on a
        # GPU; the compiled kernel's own attributes, from the driver, say the same things.
        for kernel in missing:
            attributes = function(file.stem, kernel, dict(defines)).attributes
            resources[kernel] = Resources(kernel, attributes["num_regs"], attributes["shared_size_bytes"],
                                          attributes["local_size_bytes"], 0, 0)
        missing = []
    if missing:
        raise CompileError(f"{file.name}: NVRTC compiled it but reported no resources for {', '.join(missing)}")
    return CompileReport(file.name, arch, resources, log_text)


def entry_points(text: str) -> list[str]:
    """The names of the ``extern "C" __global__`` kernels defined in CUDA C source ``text``."""
    launch_bounds = r'(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?'
    return re.findall(r'extern\s+"C"\s+__global__\s+void\s+' + launch_bounds + r'(\w+)\s*\(', text)


def _cupy():
    try:
        import cupy
    except ImportError as error:
        raise kernel_mode.MissingPackage(
            "launching CUDA C needs CuPy: pip install cupy-cuda12x (or cupy-cuda13x for CUDA 13)") from error
    return cupy


@cache
def _module(name: str, defines: Defines = ()):
    return _cupy().RawModule(code=source(name), options=_options(defines))


def function(name: str, kernel: str, defines: Mapping[str, int] | None = None):
    """The CuPy kernel ``kernel`` of file ``name``, compiled for this GPU once per ``defines``, then reused."""
    if not kernel_mode.on_gpu():
        raise ValueError(
            f"{name}: CUDA C kernels launch only on a GPU, and this run uses numba's simulator; "
            "compile_report() checks that they compile")
    module = _module(path(name).stem, _defines(defines))
    try:
        return module.get_function(kernel)
    except Exception as error:  # CuPy raises its driver's error type for an unknown name
        raise ValueError(f"kernel: {path(name).name} has no kernel {kernel!r}") from error


def _argument(value: object, position: int):
    if isinstance(value, torch.Tensor):
        if value.device.type != "cuda" or not value.is_contiguous():
            raise ValueError(f"argument {position}: a contiguous CUDA tensor, got one on {value.device}")
        return _cupy().asarray(value.detach())
    if isinstance(value, bool):
        return np.int32(value)
    if isinstance(value, int):
        if not INT32[0] <= value <= INT32[1]:
            raise ValueError(f"argument {position}: {value} does not fit the kernel's 32-bit int")
        return np.int32(value)
    if isinstance(value, float):
        return np.float32(value)
    if isinstance(value, np.generic):
        return value
    raise TypeError(f"argument {position}: a tensor, int, float or NumPy scalar, got {type(value).__name__}")


def _dim3(value: int | tuple[int, ...], what: str) -> tuple[int, ...]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, int) or d < 1 for d in dims):
        raise ValueError(f"{what}: one to three positive ints, got {value!r}")
    return dims


def prepared(name: str, kernel: str, grid: int | tuple[int, ...], block: int | tuple[int, ...], *args,
             shared_bytes: int = 0, defines: Mapping[str, int] | None = None) -> Callable[[], None]:
    """A function that launches ``kernel<<<grid, block, shared_bytes>>>(*args)`` of file ``name`` on the GPU.

    Tensors pass as device pointers; Python ints as C ``int``, floats as C ``float``; NumPy scalars
    as they are (``np.int64(n)`` for a ``long``). More than 48 KB of dynamic shared memory raises the
    kernel's limit first, as ``cudaFuncSetAttribute`` would. The arguments are converted once, here, so that
    repeated calls cost only the launch itself (what a timer should see).
    """
    grid, block = _dim3(grid, "grid"), _dim3(block, "block")
    if np.prod(block) > 1024:
        raise ValueError(f"block: at most 1024 threads per block, got {int(np.prod(block))}")
    function_ = function(name, kernel, defines)
    if shared_bytes > DEFAULT_DYNAMIC_SHARED_BYTES:  # a kernel must opt in to more (up to 227 KB on Hopper)
        function_.max_dynamic_shared_size_bytes = shared_bytes
    converted = tuple(_argument(a, i) for i, a in enumerate(args))

    def run() -> None:
        function_(grid, block, converted, shared_mem=shared_bytes)

    return run


def launch(name: str, kernel: str, grid: int | tuple[int, ...], block: int | tuple[int, ...], *args,
           shared_bytes: int = 0, defines: Mapping[str, int] | None = None) -> None:
    """Launch ``kernel<<<grid, block, shared_bytes>>>(*args)`` of file ``name`` on the GPU (asynchronously)."""
    prepared(name, kernel, grid, block, *args, shared_bytes=shared_bytes, defines=defines)()


def time_launch(name: str, kernel: str, grid: int | tuple[int, ...], block: int | tuple[int, ...], *args,
                shared_bytes: int = 0, defines: Mapping[str, int] | None = None) -> timing.Timing:
    """Time repeated launches with :func:`gpulab.core.timing.measure` (CUDA events; L2 not flushed: the kernels
    of the book that are timed this way stream far more data than L2 holds, or compute from registers)."""
    run = prepared(name, kernel, grid, block, *args, shared_bytes=shared_bytes, defines=defines)
    return timing.measure(run, device=env.device(), flush_l2=False)
