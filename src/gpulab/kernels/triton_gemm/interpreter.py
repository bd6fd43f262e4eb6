"""Where the Triton kernels run, and the one repair Triton 3.6's interpreter needs under NumPy 2.4.

Triton compiles a ``@triton.jit`` function for a GPU the first time it is launched. Without a GPU, Triton's
*interpreter* runs the same function on the CPU with NumPy: every program of the grid in turn, every block
operation as a NumPy operation on whole arrays. It is slow, but it runs the kernel's own code, masks and
indices included, so a wrong offset fails here exactly as it would on the GPU.

The interpreter is switched on by the environment variable ``TRITON_INTERPRET=1``, and Triton reads it when a
kernel is *decorated* (``triton.jit`` returns an interpreted function instead of a compiled one), that is when
the module defining the kernel is imported, not when it is launched. So :func:`choose_mode` must run before the
step modules are imported; the package's ``__init__`` calls it first. The choice follows
:mod:`gpulab.core.kernel_mode`, the one switch the book has for where kernels run: under its simulator (no GPU)
the Triton kernels are interpreted, on a GPU they are compiled.

**The NumPy 2.4 problem.** In the interpreter a scalar, such as the argument ``K`` or ``tl.cdiv(K, BLOCK_K)``,
is a NumPy array of *one element and one dimension*, shape ``(1,)``. When a kernel writes
``for k in range(0, tl.cdiv(K, BLOCK_K))``, Python's ``range`` asks that scalar for an integer through its
``__index__`` method, which Triton 3.6's interpreter defines (``_patch_lang_tensor`` in
``triton/runtime/interpreter.py``) as ``int(self.handle.data)``. ``int()`` of an array with ``ndim > 0`` was
deprecated in NumPy 1.25 and is a ``TypeError`` from NumPy 2.4 on ("only 0-dimensional arrays can be converted
to Python scalars"). So in Triton 3.6.0 with NumPy 2.4, every loop whose bound is a run-time argument fails
under the interpreter -- and every GEMM has one, the loop over K. Triton fixed it upstream (issue
triton-lang/triton#9171, pull request #9172: take the element out before converting it) after 3.6.0.

We keep NumPy 2.4 for the book and repair the one method, here, instead of the other ways out:

- pinning NumPy 2.3 would hold the whole book back for one interpreter method;
- making the K loop's bound a ``tl.constexpr`` would compile a new kernel for every K on the GPU;
- a ``while`` loop would avoid ``range`` but the GPU compiler pipelines only ``for`` loops, and pipelining is
  step 2's point.

The repair (:func:`install_index_repair`) wraps Triton's ``_patch_lang_tensor`` so that, after Triton has put
its interpreter methods on ``tl.tensor``, ``__index__`` is replaced by one that takes the single element out
first (``.item()``), which is what the upstream fix does. It is installed only when all three hold:
the interpreter is on, NumPy refuses ``int()`` of a one-element array, and the installed Triton's method still
has the faulty ``int(self.handle.data)`` (:func:`triton_has_index_bug`). The unit tests check that the bug is
still there in the pinned Triton (so that the repair is dropped when the pin moves to a fixed Triton) and
that the repaired method converts what the original cannot.

**When triton was imported first.** Triton's own library (``tl.zeros``, ``tl.sum``'s helpers, ...) is made of
``@triton.jit`` functions too, decorated when ``import triton`` runs. If anything imported triton before
:func:`choose_mode` set ``TRITON_INTERPRET=1`` -- ``torch.utils.flop_counter`` does, to ask whether it is there,
and chapter 06's attention module imports that -- those stay compiled-mode functions, and the first interpreted
kernel that calls one fails with "Cannot call @triton.jit'd outside of the scope of a kernel". So
:func:`choose_mode` also replaces each of them by the interpreted function ``@triton.jit`` would have made
(:func:`interpret_triton_library`): one replacement per function, shared by every module that names it.
"""

from __future__ import annotations

import inspect
import os
import sys

import numpy as np

from gpulab.core import kernel_mode

FAULTY_INDEX = "int(self.handle.data)"  # the text of Triton 3.6.0's interpreter __index__


def choose_mode() -> bool:
    """Switch Triton's interpreter on under the simulator (no GPU); return whether kernels are interpreted.

    On a GPU the variable is left as the user set it: ``TRITON_INTERPRET=1`` there interprets the kernels on
    the host (to step through one), anything else compiles them. Without a GPU, ``TRITON_INTERPRET=0`` set
    explicitly keeps the kernels compiled: they cannot be launched, but they can be compiled for a GPU named
    by hand (:func:`.ladder.cross_compile`).
    """
    if not kernel_mode.on_gpu() and os.environ.get("TRITON_INTERPRET", "").strip() != "0":
        os.environ["TRITON_INTERPRET"] = "1"
    interpret_triton_library()  # in case something imported triton before the mode was chosen
    return interpreting()


def interpreting() -> bool:
    """True when ``@triton.jit`` kernels defined from now on run in Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def numpy_refuses_scalar_of_array() -> bool:
    """True when ``int()`` of a one-element, one-dimensional array is a TypeError (NumPy 2.4 and later)."""
    try:
        int(np.zeros(1, dtype=np.int32))
    except TypeError:
        return True
    return False


def _interpreter_module():
    from triton.runtime import interpreter  # imported late: only the interpreter's users need it

    return interpreter


def triton_has_index_bug() -> bool:
    """True when the installed Triton's interpreter converts scalars with ``int(self.handle.data)``."""
    original = getattr(_index_repaired, "original", None) or _interpreter_module()._patch_lang_tensor
    return FAULTY_INDEX in inspect.getsource(original)


def scalar_index(tensor) -> int:
    """``__index__`` of an interpreted Triton scalar: its one element as a Python int (a block is refused)."""
    return int(tensor.handle.data.item())


def _index_repaired(tensor_class, scope) -> None:
    """Triton's ``_patch_lang_tensor``, then our ``__index__`` on top (restored with Triton's own, in order)."""
    _index_repaired.original(tensor_class, scope)
    scope.set_attr(tensor_class, "__index__", scalar_index)


def install_index_repair() -> bool:
    """Install the ``__index__`` repair where it is needed (see the module's docstring); True if installed."""
    if not (interpreting() and numpy_refuses_scalar_of_array()):
        return False
    interpreter = _interpreter_module()
    if interpreter._patch_lang_tensor is _index_repaired:
        return True
    if not triton_has_index_bug():
        return False
    _index_repaired.original = interpreter._patch_lang_tensor
    interpreter._patch_lang_tensor = _index_repaired
    return True


def index_repair_installed() -> bool:
    """True when the interpreter currently uses the repaired ``__index__``."""
    return interpreting() and _interpreter_module()._patch_lang_tensor is _index_repaired


def interpret_triton_library() -> int:
    """Replace Triton's compiled-mode library functions by interpreted ones when the interpreter is on and triton
    was imported before the mode was chosen (see the module); returns how many."""
    if not interpreting() or "triton.language" not in sys.modules:
        return 0
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    replacements: dict[int, InterpretedFunction] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("triton.language") or module is None:
            continue
        for attribute, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in replacements:
                    replacements[id(value)] = InterpretedFunction(value.fn)
                setattr(module, attribute, replacements[id(value)])
    return len(replacements)
