"""Graders of the lab "GFLOP/s against N" (``labs/02_gflops_vs_n.ipynb``): the FLOP of a matrix multiply, a
NumPy product timed on the CPU, and a PyTorch product timed on its device. A wrong count is quoted with its mistake
named (n^3, 2 n^2, n^2, Python's ``^``); a wrong time too (milliseconds, a clock read backwards, a timed region that
misses the product or holds more than it). Timing on a GPU without synchronising gives a time many times too short.

On a runtime without a GPU that lesson cannot be seen: PyTorch finishes a CPU product before ``A @ B`` returns. So
:func:`setup` makes ``torch.cuda.synchronize`` a no-op there that counts its calls (a student's unconditional call
runs instead of failing with "Torch not compiled with CUDA"), and :func:`check_time_torch_matmul` asks on a CPU
whether the code waits for the device: a call the recorder saw, or one in the function's source that a device
check kept from running.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Sequence

import numpy as np
import torch

from gpulab.core import env, timing
from gpulab.core.tables import Column
from gpulab.labs.grading import NOT_ANSWERED, SECONDS, Grader, Mistake, attempt, number_problem, shown

# --- exercise 1: the FLOP of a matrix multiply ----------------------------------------------------------------

FLOPS_HINT = "each of the n*n outputs needs n multiplications and n additions: 2 n^3 in all"


def flops_mistakes(n: int) -> list[Mistake]:
    return [
        Mistake("that counts the multiply-adds: each is two operations, a multiplication and an addition",
                value=n**3, rel=1e-9),
        Mistake("2 n^2 is the work of a matrix-vector product: each of the n^2 outputs is a dot product of "
                "length n", value=2 * n**2, rel=1e-9),
        Mistake("n^2 is the number of outputs: each of them costs 2 n operations", value=n**2, rel=1e-9),
        Mistake("that counts n - 1 additions per output: the convention counts n, one per multiply-add "
                "(2 n^3)", value=2 * n**3 - n**2, rel=1e-9),
        Mistake("in Python ^ is the bitwise exclusive or, not a power: write n**3", value=2 * (n ^ 3), rel=1e-9),
        Mistake("in Python ^ is the bitwise exclusive or, not a power: write 2 * n**3", value=(2 * n) ^ 3,
                rel=1e-9),
    ]


def check_matmul_flops(grader: Grader, matmul_flops: Callable, n: int = 4000) -> None:
    """Exercise 1: ``matmul_flops(n)`` is 2 n^3."""
    got, problem = attempt(lambda: matmul_flops(n))
    grader.record(f"matmul_flops({n})", problem or number_problem(got, 2 * n**3, 1e-9, flops_mistakes(n)),
           FLOPS_HINT)


# --- a time against gpulab's ---------------------------------------------------------------------------------

LOW, HIGH = 0.25, 10  # a time within this factor of gpulab's passes: the window catches a timer that misses
# the work, or times more than it, and not the noise of a busy machine
OUTSIDE = (Mistake("the clock was read backwards: return end - start, not start - end", test=lambda got: got < 0),
           Mistake("both clock readings are the same moment: put A @ B between them", test=lambda got: got == 0))


def times_problem(times: Sequence[object], reference: float, mistakes: Sequence[Mistake]) -> str:
    """'' if the fastest of ``times`` lies within [LOW, HIGH] times ``reference``; otherwise what is wrong."""
    if any(t is None for t in times):
        return NOT_ANSWERED
    numbers = [t.item() if isinstance(t, np.generic) or (isinstance(t, torch.Tensor) and t.numel() == 1) else t
               for t in times]
    wrong = [t for t in numbers if isinstance(t, bool) or not isinstance(t, int | float)]
    if wrong:
        return f"returned {shown(wrong[0])}, not a number of seconds"
    fastest = min(numbers)
    if reference > 0 and LOW <= fastest / reference <= HIGH:
        return ""
    return number_problem(fastest, reference, 0, [*OUTSIDE, *mistakes])


def _no_cuda(error: Exception) -> str:
    if "not compiled with CUDA" in str(error) or "NVIDIA driver" in str(error):
        return ("torch.cuda.synchronize() needs a GPU, and this runtime has none: run the lab's import cell (it "
                "makes the call harmless here), or call it only when A.device.type == 'cuda'")
    return ""


def timed(answer: Callable[[], object], work: Callable[[], object], device: torch.device, repeats: int = 5
          ) -> tuple[list[object], float, str]:
    """The student's ``repeats`` times, gpulab's fastest time of ``work`` (measured before and after them, so that
    a burst of load on a shared machine rarely slows one side only), and '' or what went wrong."""
    before = timing.measure(work, device=device, repeats=5).min_s
    times = []
    for _ in range(repeats):
        got, problem = attempt(answer, _no_cuda)
        if problem:
            return [], before, problem
        times.append(got)
    return times, min(before, timing.measure(work, device=device, repeats=5).min_s), ""


# --- exercise 2: NumPy on the CPU ----------------------------------------------------------------------------

NUMPY_HINT = ("time only the product: read time.perf_counter() just before A @ B and again just after, and "
              "return the difference in seconds")


def numpy_mistakes(reference: float) -> list[Mistake]:
    return [
        *SECONDS,
        Mistake("far shorter than the product takes: the timed region misses A @ B (read the clock, multiply, "
                "read the clock)", test=lambda got: got < LOW * reference),
        Mistake("far longer than one product: the timed region holds more than A @ B (the warm-up, several "
                "products, creating the matrices, a print?)", test=lambda got: got > HIGH * reference),
    ]


def check_time_numpy_matmul(grader: Grader, time_numpy_matmul: Callable, A: np.ndarray, B: np.ndarray) -> None:
    """Exercise 2: the fastest of five ``time_numpy_matmul(A, B)`` within a quarter to ten times gpulab's fastest
    (at a size of a few milliseconds at least, so that the window is steady on a busy machine)."""
    times, reference, problem = timed(lambda: time_numpy_matmul(A, B), lambda: A @ B, torch.device("cpu"))
    problem = problem or times_problem(times, reference, numpy_mistakes(reference))
    grader.record(f"time_numpy_matmul at n = {A.shape[0]}", problem, NUMPY_HINT)


# --- exercise 3: PyTorch on its device, synchronised ----------------------------------------------------------


class SynchronizeRecorder:
    """``torch.cuda.synchronize`` on a runtime without a GPU: it does nothing (there is nothing to wait for) and
    counts its calls, so that the lab can see that a student's code waits for the device."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, device: object = None) -> None:
        self.calls += 1

    def __repr__(self) -> str:
        return f"<torch.cuda.synchronize on a runtime without a GPU: a no-op, called {self.calls} times>"


def setup() -> SynchronizeRecorder | None:
    """Called by the lab's import cell. Without a GPU, replace ``torch.cuda.synchronize`` by a
    :class:`SynchronizeRecorder` and return it (the one already there on a second call); with a GPU, change
    nothing and return None. A notebook's kernel ends with the lab, so nothing is restored."""
    if env.has_gpu():
        return None
    if not isinstance(torch.cuda.synchronize, SynchronizeRecorder):
        torch.cuda.synchronize = SynchronizeRecorder()
    return torch.cuda.synchronize


def installed() -> SynchronizeRecorder | None:
    """The recorder that :func:`setup` put in place of ``torch.cuda.synchronize``, if any."""
    return torch.cuda.synchronize if isinstance(torch.cuda.synchronize, SynchronizeRecorder) else None


def _called_names(fn: Callable) -> list[str] | None:
    """The names that ``fn``'s source calls (``torch.cuda.synchronize(...)`` gives 'synchronize'), or None
    where its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    return [node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)]


def calls_synchronize(fn: Callable, depth: int = 1) -> bool:
    """Whether ``fn``'s source calls a ``synchronize`` (``torch.cuda.synchronize``, an event's ``synchronize``),
    itself or in a function of the notebook it calls (``depth`` levels down)."""
    names = _called_names(fn) or []
    if "synchronize" in names:
        return True
    helpers = getattr(fn, "__globals__", {})
    return depth > 0 and any(
        calls_synchronize(helpers[name], depth - 1) for name in set(names)
        if inspect.isfunction(helpers.get(name)) and helpers[name] is not fn
        and helpers[name].__module__ == fn.__module__)


SYNC_HINT = ("A @ B only queues the product on a GPU and returns at once: call torch.cuda.synchronize() after the "
             "product, before reading the clock (and once before starting it, so that earlier work is not counted)")
CPU_NOTE = "   A CPU finishes A @ B before it returns, so no wait shows: see the GPU recording below."


def torch_mistakes(reference: float, device: torch.device) -> list[Mistake]:
    if device.type != "cuda":
        return numpy_mistakes(reference)
    return [*SECONDS,
            Mistake("many times shorter than the product takes: the clock stopped while the GPU was still "
                    "working (the time of the launch, not of the product)", test=lambda got: got < LOW * reference),
            Mistake("far longer than one product: the timed region holds more than A @ B (the warm-up, the "
                    "first call's cuBLAS start-up, several products?)", test=lambda got: got > HIGH * reference)]


def check_time_torch_matmul(grader: Grader, time_torch_matmul: Callable, A: torch.Tensor, B: torch.Tensor) -> None:
    """Exercise 3: ``time_torch_matmul(A, B)`` must give the true time of one product on ``A.device``.

    The time is graded as in exercise 2, against gpulab's timer. On a GPU that settles it: without
    synchronisation the time is many times too short. On a CPU it does not (the product is done before ``A @ B``
    returns), so the code must also wait for the device: the :class:`SynchronizeRecorder` of :func:`setup` saw it
    call ``torch.cuda.synchronize``, or its source calls it behind a device check that never runs on a CPU.
    """
    device = A.device
    name = f"time_torch_matmul at n = {A.shape[0]}"
    recorder = installed()
    before = recorder.calls if recorder is not None else 0
    times, reference, problem = timed(lambda: time_torch_matmul(A, B), lambda: A @ B, device)
    problem = problem or times_problem(times, reference, torch_mistakes(reference, device))
    if problem or device.type == "cuda":
        grader.record(name, problem, SYNC_HINT if device.type == "cuda" else NUMPY_HINT)
    elif (recorder is not None and recorder.calls > before) or calls_synchronize(time_torch_matmul):
        grader.record(name, "", "")
        print(CPU_NOTE)
    else:
        grader.record(name, "the time is plausible on this CPU, but the code never waits for the device (no "
               "torch.cuda.synchronize()): on a GPU it would time the launch, not the product",
               SYNC_HINT + "; on a runtime without a GPU this lab makes the call do nothing, so it can stay "
               "unconditional")


# --- the tables of the lab's measurements --------------------------------------------------------------------

def _milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f}"


TIMES = [Column("n", "N"), Column("seconds", "time", "ms", _milliseconds), Column("gflops", "rate", "GFLOP/s",
                                                                                   ",.0f")]
NAIVE_AND_HONEST = [Column("n", "N"), Column("gflops", "naive", "GFLOP/s", ",.0f"),
                    Column("honest_gflops", "synchronised", "GFLOP/s", ",.0f"),
                    Column("too_fast", "naive / synchronised", "", ",.1f")]
RECORDED = [Column("n", "N"), Column("naive_seconds", "naive", "ms", _milliseconds),
            Column("naive_gflops", "naive", "GFLOP/s", ",.0f"), Column("seconds", "synchronised", "ms", _milliseconds),
            Column("gflops", "synchronised", "GFLOP/s", ",.0f")]
