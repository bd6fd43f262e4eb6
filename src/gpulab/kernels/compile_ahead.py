"""Triton's compiles done ahead, in parallel processes, before the experiment that needs them.

Triton compiles a ``@triton.jit`` kernel the first time it is launched with a new *specialization*, and keeps the
result in its on-disk cache (``TRITON_CACHE_DIR``, by default ``~/.triton/cache``). The cache key is the kernel's
source (with every jitted function it calls), the types of its arguments and what Triton assumes about them (an
integer equal to 1 becomes a constant, one divisible by 16 is marked so; a pointer aligned to 16 bytes is marked
so; a host TMA descriptor only by its dtype and block shape), the ``constexpr`` values, the launch options
(``num_warps``, ``num_stages``), the GPU and Triton's version. A compile takes about a second on one core (LLVM,
then ``ptxas``); a sweep that launches 36 kernels in turn spends half a minute compiling while the other cores of
the machine idle. Any process that later launches the same kernel with the same key loads it from the disk in
milliseconds.

:func:`compile_ahead` runs a list of *tasks* in fresh processes, several at once, and returns when every one has
ended. A task is ``(target, kwargs)``: ``target`` a module-level function, or its name ``"package.module:function"``,
and ``kwargs`` picklable keyword arguments; run in a worker on the GPU, the call must launch exactly the kernels the
experiment will launch, with the same keys. The simplest faithful task runs the experiment's own checked launch
(the same launcher, dtype and configuration) at a small size that Triton specializes as it does the timed sizes
(:func:`specialization`, :func:`one_per_specialization`); :func:`in_turn` runs several calls as one task. The workers
are started with ``spawn``: a process forked from one whose CUDA is initialised cannot use CUDA. A spawned worker
gets the parent's ``sys.path`` and working folder (so a ``gpulab`` put on the path by a notebook's first cell is
found) and inherits its environment (``TRITON_CACHE_DIR`` and the rest).

It is best effort. A task that fails is listed in ``failed`` (one line each) and nothing more: the experiment then
compiles that kernel itself, and reports a real error where it always did. Without a GPU, under Triton's
interpreter, or with too few cores to run two workers beside the notebook, it does nothing and returns at once.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import multiprocessing
import os
import pickle
import re
import time
from collections.abc import Callable, Iterable, Sequence

MAX_WORKERS = 8  # a compile is one core's work; more workers than this only add process starts
SPARE_CORES = 2  # left to the notebook's own process and the system
TIMEOUT_SECONDS = 300.0  # a worker still busy after this is stopped, and its tasks count as failed
_TARGET = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def specialization(n: int) -> str:
    """How Triton specializes an integer argument of value ``n``: ``"one"`` (compiled in as a constant),
    ``"multiple of 16"`` (marked divisible by 16) or ``"other"``; values of one kind share a compiled kernel."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n: an int, got {type(n).__name__}")
    return "one" if n == 1 else "multiple of 16" if n % 16 == 0 else "other"


def one_per_specialization(sizes: Iterable[int]) -> list[int]:
    """The smallest of ``sizes`` of each :func:`specialization`, in increasing order: one size per compiled kernel."""
    smallest: dict[str, int] = {}
    for n in sizes:
        kind = specialization(n)
        smallest[kind] = min(n, smallest.get(kind, n))
    return sorted(smallest.values())


def target_name(target: str | Callable) -> str:
    """``"package.module:function"`` for a module-level function (or that name itself, checked)."""
    if callable(target) and not isinstance(target, str):
        name = f"{getattr(target, '__module__', None)}:{getattr(target, '__qualname__', '')}"
    else:
        name = target
    if not isinstance(name, str) or not _TARGET.match(name):
        raise ValueError(f"target: a module-level function or its name 'package.module:function', got {target!r}")
    return name


def check_task(task: object, where: str = "task") -> tuple[str, dict]:
    """``task`` as ``(target name, kwargs)``, or a ValueError naming ``where`` and what is wrong with it."""
    if not isinstance(task, tuple | list) or len(task) != 2:
        raise ValueError(f"{where}: a pair (target, kwargs), got {task!r:.200}")
    target, kwargs = task
    try:
        name = target_name(target)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise ValueError(f"{where}: kwargs must be a dict of keyword arguments, got {kwargs!r:.200}")
    try:
        pickle.dumps(kwargs)
    except Exception as error:  # noqa: BLE001  (pickle raises several kinds)
        raise ValueError(f"{where}: kwargs must be picklable (they go to another process): {error}") from None
    return name, kwargs


def _resolve(name: str) -> Callable:
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


def in_turn(calls: Sequence[tuple]) -> list:
    """Run ``calls`` (tasks, see :func:`check_task`) one after another in this process; their results. Every call
    runs even if one before it failed; then the first failure is raised."""
    checked = [check_task(call, f"calls[{i}]") for i, call in enumerate(calls)]
    results, first_error = [], None
    for name, kwargs in checked:
        try:
            results.append(_resolve(name)(**kwargs))
        except Exception as error:  # noqa: BLE001  (best effort: the next call may still compile its kernels)
            results.append(None)
            first_error = first_error or error
    if first_error is not None:
        raise first_error
    return results


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``, at most 200 characters."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:200]


def _call(name: str, kwargs: dict) -> tuple[bool, object]:
    """What a worker runs: ``(True, result)``, or ``(False, one line)`` when the call raised (the exception itself
    may not survive the trip back to the parent)."""
    try:
        result = _resolve(name)(**kwargs)
    except Exception as error:  # noqa: BLE001  (reported, never raised: the experiment compiles it again)
        return False, first_line(error)
    try:
        pickle.dumps(result)
    except Exception:  # noqa: BLE001
        result = repr(result)[:200]
    return True, result


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(tasks: int) -> int:
    """``min(tasks, usable cores - 2, 8)``: the notebook's process and the system keep two cores."""
    return min(tasks, usable_cores() - SPARE_CORES, MAX_WORKERS)


def why_not() -> str | None:
    """None when compiling ahead can help here; otherwise why not (no GPU, Triton's interpreter)."""
    from gpulab.core import kernel_mode

    if not kernel_mode.on_gpu():
        return "no GPU: the kernels are not compiled here"
    from gpulab.kernels.triton_gemm import interpreter

    if interpreter.interpreting():
        return "Triton's interpreter runs the kernels (TRITON_INTERPRET=1): nothing is compiled"
    return None


def _stop(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Stop the workers of ``pool`` (after a timeout): every one of them was started here."""
    processes = dict(getattr(pool, "_processes", None) or {})
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes.values():
        if process.is_alive():
            process.terminate()
    for process in processes.values():
        process.join(5)


def compile_ahead(tasks: Sequence[tuple], workers: int | None = None, *, enabled: bool | None = None,
                  timeout_s: float = TIMEOUT_SECONDS, quiet: bool = False) -> dict:
    """Run ``tasks`` (``(target, kwargs)`` pairs, :func:`check_task`) in ``workers`` spawned processes and wait for
    all of them; what happened, as ``{"tasks", "workers", "failed", "seconds", "skipped", "results"}``.

    ``failed`` has one line per task that raised, timed out or lost its worker; ``results`` the return value of
    each task in order (None where it failed). ``workers`` defaults to :func:`default_workers`. ``enabled``:
    None decides here (:func:`why_not`, and at least two workers); False skips (``skipped`` says so); True runs
    even without a GPU (the tests). Unless ``quiet``, a run prints one line (a skipped one prints nothing).
    """
    if isinstance(tasks, str | bytes) or not isinstance(tasks, Sequence):
        raise ValueError(f"tasks: a list of (target, kwargs) pairs, got {type(tasks).__name__}")
    checked = [check_task(task, f"tasks[{i}]") for i, task in enumerate(tasks)]
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers: a positive int or None, got {workers!r}")
    if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool) or not timeout_s > 0:
        raise ValueError(f"timeout_s: a positive number of seconds, got {timeout_s!r}")
    count = workers if workers is not None else max(1, default_workers(len(checked)))
    outcome = {"tasks": len(checked), "workers": 0, "failed": [], "seconds": 0.0, "skipped": None,
               "results": [None] * len(checked)}
    if enabled is False:
        outcome["skipped"] = "not asked to"
    elif enabled is None:
        if not checked:
            outcome["skipped"] = "no tasks"
        elif reason := why_not():
            outcome["skipped"] = reason
        elif workers is None and default_workers(len(checked)) < 2:
            outcome["skipped"] = f"too few tasks or cores for two workers ({usable_cores()} cores)"
    if outcome["skipped"] or not checked:
        return outcome
    start = time.perf_counter()
    outcome["workers"] = count = min(count, len(checked))
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=count, mp_context=multiprocessing.get_context("spawn"))
    futures = {pool.submit(_call, name, kwargs): i for i, (name, kwargs) in enumerate(checked)}
    done, late = concurrent.futures.wait(futures, timeout=timeout_s)
    failures: dict[int, str] = {}
    for future in done:
        i = futures[future]
        try:
            ok, value = future.result()
        except Exception as error:  # noqa: BLE001  (a worker that died: BrokenProcessPool)
            ok, value = False, f"the worker process died: {first_line(error)}"
        if ok:
            outcome["results"][i] = value
        else:
            failures[i] = value
    for future in late:
        failures[futures[future]] = f"still running after {timeout_s:g} s: stopped"
    if late:
        _stop(pool)
    else:
        pool.shutdown(wait=True)
    outcome["failed"] = [f"{checked[i][0]} (task {i}): {line}" for i, line in sorted(failures.items())]
    outcome["seconds"] = time.perf_counter() - start
    if not quiet:
        print(describe(outcome), flush=True)
    return outcome


def describe(outcome: dict) -> str:
    """One line about a :func:`compile_ahead` run: tasks, workers, seconds, and the first failure if any."""
    if outcome["skipped"]:
        return f"Triton kernels not compiled ahead: {outcome['skipped']}."
    failed = outcome["failed"]
    line = (f"Triton kernels compiled ahead: {outcome['tasks']} tasks on {outcome['workers']} processes in "
            f"{outcome['seconds']:.1f} s")
    if failed:
        line += f"; {len(failed)} failed (compiled again when launched), first: {failed[0]}"
    return line + "."
