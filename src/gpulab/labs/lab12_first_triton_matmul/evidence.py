"""A notebook's Triton kernel compiled for Hopper (sm_90) without a GPU, to read what pipelining changes in it.

Where no GPU runs the kernels, Triton's interpreter runs them, and an interpreted kernel cannot be compiled: Triton
chooses, when ``@triton.jit`` decorates a function, whether it will be interpreted or compiled, for the kernel and
for Triton's own library alike (:mod:`gpulab.kernels.triton_gemm.interpreter`). So :func:`compile_for_hopper` hands
the kernel's source to a second Python process started with ``TRITON_INTERPRET=0``, which defines it again for
compiling and compiles it for sm_90 with :func:`gpulab.kernels.triton_gemm.ladder.cross_compile`, once per pipeline
depth, with the ``ptxas`` and ``cuobjdump`` that Triton's wheel ships. The process prints the evidence of each
compiled kernel (:func:`gpulab.kernels.triton_gemm.ladder.evidence`: the SASS instruction counts, the shared memory,
the stages) as JSON. On a GPU the same happens, so the evidence is Hopper's whatever the GPU.

The kernel must have the signature of :func:`.reference.matmul_kernel` and use nothing from the notebook but
``triton`` and ``triton.language as tl``: only its own source is copied.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

from gpulab.core.validation import positive_ints
from gpulab.labs.lab12_first_triton_matmul.diagnose import python_function

PREAMBLE = "import triton\nimport triton.language as tl\n\n\n"
TIMEOUT_S = 240  # importing torch and triton, then a second or two per compile


def kernel_source(kernel) -> str:
    """The source of a ``@triton.jit`` function, its decorator included, dedented; a TypeError if it is none."""
    function = python_function(kernel)
    if function is None:
        raise TypeError(f"kernel: a function decorated with @triton.jit, got {type(kernel).__name__}")
    return textwrap.dedent(inspect.getsource(function))


def compile_for_hopper(kernel, config: Mapping, stages: Sequence[int], dtype: str = "float16") -> dict[int, dict] | str:
    """``{num_stages: evidence}`` of ``kernel`` compiled for sm_90 with ``config`` (tiles and ``num_warps``) at each
    of ``stages``; or, when it cannot be compiled here, one sentence that says why."""
    stages = positive_ints("stages", stages)
    if not isinstance(config, Mapping):
        raise TypeError(f"config: a dict of tiles and launch settings, got {type(config).__name__}")
    try:
        source, name = kernel_source(kernel), python_function(kernel).__name__
    except (OSError, TypeError) as error:
        return f"The kernel's source could not be read, so it was not compiled ({error})."
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "notebook_kernel.py"
        path.write_text(PREAMBLE + source)
        env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = [sys.executable, "-m", __name__, str(path), name, json.dumps(dict(config)), json.dumps(stages), dtype]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"Compiling the kernel for Hopper took longer than {TIMEOUT_S} s, so it was stopped."
    if done.returncode:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"The kernel could not be compiled for Hopper here ({reason})."
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return {int(depth): row for depth, row in rows.items()}


def main(arguments: Sequence[str]) -> int:
    """Compile the kernel ``name`` of the file ``path`` for sm_90 at each depth; print ``{depth: evidence}``."""
    from gpulab.kernels.triton_gemm import interpreter, ladder  # the package chose the mode from TRITON_INTERPRET

    path, name, config, stages, dtype = arguments
    if interpreter.interpreting():
        raise SystemExit("TRITON_INTERPRET must be 0 in the compiling process")
    spec = importlib.util.spec_from_file_location("notebook_kernel", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["notebook_kernel"] = module
    spec.loader.exec_module(module)
    step = SimpleNamespace(__name__="yours", CONFIG=json.loads(config), KERNEL=getattr(module, name), LAUNCH_OPTIONS={})
    rows = {depth: ladder.evidence(ladder.cross_compile(step, dtype, num_stages=depth)) for depth in json.loads(stages)}
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
