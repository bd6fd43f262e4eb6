"""torchrun started from a notebook, robustly: a free port, one thread per worker, gpulab on the workers'
path, a time limit after which the whole process group is killed, and the workers' own errors in the exception.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence

from gpulab import SRC
from gpulab.core.validation import positive_int, positive_ints

BACKENDS = ("gloo", "nccl")  # gloo: CPU tensors, any machine; nccl: one CUDA GPU per process
TIMEOUT_S = 300.0  # the default limit of one launch, from start to the last process's exit


class LaunchError(RuntimeError):
    """torchrun's processes failed, or ran out of time. The message ends with what they reported.

    ``returncode`` is torchrun's exit status (None after a timeout); ``stderr`` all it printed there.
    """

    def __init__(self, message: str, returncode: int | None, stderr: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.returncode, self.stderr, self.timed_out = returncode, stderr, timed_out






def free_port() -> int:
    """A TCP port that is free on this machine now: the operating system's choice for a bind to port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def worker_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for the workers, with gpulab importable and one thread per worker.

    NVLink SHARP (in-switch reduction, ``NCCL_NVLS_ENABLE``) stays off unless the caller turned it on:
    it is another algorithm than the ring and tree the chapter measures, and the shared GPU machines the
    book is recorded on ask for it to stay off.
    """
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [environment.get("PYTHONPATH")])])
    environment["OMP_NUM_THREADS"] = "1"  # the workers share the cores: one thread each, not one pool each
    environment["PYTHONUNBUFFERED"] = "1"
    environment.setdefault("NCCL_NVLS_ENABLE", "0")
    environment.update(extra or {})
    return environment


def _kill_group(process: subprocess.Popen) -> None:
    """Stop torchrun and every worker it started (they share its process group), politely, then not."""
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(arguments: Sequence[str], processes: int, *, timeout_s: float = TIMEOUT_S,
           environment: Mapping[str, str] | None = None, attempts: int = 2) -> str:
    """Run ``torchrun --nproc_per_node processes ARGUMENTS`` and return what it printed on stdout.

    ``arguments`` follow torchrun's own: a script path, ``-m`` and a module name, or ``--no-python`` and a
    command, then its arguments. Raises :class:`LaunchError` if torchrun exits with an error (after trying
    once more on another port if the first was taken meanwhile, or if a rank was killed by a signal) or
    runs past ``timeout_s``, in which case every process it started is killed.
    """
    processes = positive_int("processes", processes)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
    for attempt in range(positive_int("attempts", attempts)):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(processes),
                   "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *arguments]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=worker_environment(environment), start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            stdout, stderr = process.communicate()
            raise LaunchError(f"torchrun ran past its limit of {timeout_s:g} s and was stopped; it printed:\n"
                              f"{_tail(stderr)}", None, stderr, timed_out=True) from None
        if process.returncode == 0:
            return stdout
        port_taken = "EADDRINUSE" in stderr or "address already in use" in stderr.lower()
        # A rank killed by a signal before it could report: gloo's C++ aborts (SIGABRT) when setting up its
        # connections fails, which CI saw once with two notebooks launching torchrun at the same time (an open
        # PyTorch issue, pytorch/pytorch#188266, reports gloo aborting in its connection code the same way).
        killed = "received by PID" in stderr
        if not ((port_taken or killed) and attempt + 1 < attempts):
            raise LaunchError(f"torchrun exited with status {process.returncode}; it printed:\n{_tail(stderr)}",
                              process.returncode, stderr)
    raise AssertionError("unreachable")


def _tail(text: str, lines: int = 20) -> str:
    """What a failed launch printed, shortened: the ranks' own last ``lines`` lines, then torchrun's summary.

    After the ranks' output torchrun prints a traceback of its own and a report of every failed rank,
    some 40 lines that would push the ranks' own error out of a plain tail. Of that report only the
    lines that say which rank failed, with what exit code and why, are kept.
    """
    kept = [line for line in text.splitlines() if line.strip()]
    end = next((i for i, line in enumerate(kept) if "] failed (exitcode:" in line), None)
    if end is None:  # no failure report (a timeout, or a torchrun that writes another format): the plain tail
        return "\n".join(kept[-lines:]) or "(nothing)"
    summary = [line.strip() for line in kept[end:] if line.strip().startswith(("rank ", "exitcode ", "traceback "))]
    return "\n".join([*kept[:end][-lines:], "torchrun's report:", *summary])


def check_gpus(backend: str, processes: Sequence[int]) -> None:
    """Raise ValueError if ``backend`` is nccl and this machine has fewer GPUs than the largest of ``processes``."""
    import torch  # here only: starting processes needs no torch

    wanted = max(positive_ints("processes", processes))
    if backend == "nccl" and torch.cuda.device_count() < wanted:
        raise ValueError(f"processes: nccl runs one process per GPU; {wanted} asked for, {torch.cuda.device_count()} "
                         "GPU(s) here. Run on a machine with that many GPUs, or ask for fewer processes")
