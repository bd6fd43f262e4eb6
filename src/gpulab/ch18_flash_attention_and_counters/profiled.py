"""The book's own kernels as Nsight Compute sees them: their counters in one ncu run, and the book's counts.

:func:`profile_kernels` (GPU and ncu only) runs every kernel asked for in one ncu session
(:data:`SESSION_COMMAND_EXAMPLE`): ncu's ``--profile-from-start off`` profiles only what the driver's session mode
launches between ``cudaProfilerStart`` and ``cudaProfilerStop``, that is each kernel's one profiled launch after
its warm-up, and writes its ``--csv`` page to a file, which :func:`gpulab.core.counters.parse_csv` reads: one
launch per kernel the driver checked, in the order it ran them (:func:`assign`). A kernel the session gives no
certain row for (its check failed, the session crashed or ran out of time before it, ncu profiled more or fewer
launches than the driver made, a launch's name does not match its kernel's regex) is profiled again in a process
of its own, as the book shows a reader profiling one kernel (:data:`NCU_COMMAND_EXAMPLE`: ncu skips the driver's
warm-up launches and profiles the next one). A row per kernel gives

- what the counters measured: time, FLOPs by precision (CUDA-core instructions and tensor-core operations), DRAM
  and L2 bytes, SM and memory throughput as a share of their peaks, the warp stall reasons and the top three;
- its point under the roofline (:func:`gpulab.core.counters.counter_point`: achieved FLOP/s, FLOP per DRAM byte and
  per L2 byte);
- the book's own count at the same size (:attr:`.driver.Kernel.cost`) and the ratios counter / book
  (:func:`gpulab.core.counters.compare_counts`, within 10% or not); a kernel with no arithmetic (a transpose) is
  compared on its bytes only;
- the driver's check of the profiled launch (its relative error against float64) and how long ncu took:
  ``profiled_in`` ('session' or 'own process'), ``profile_seconds`` (a process's wall time; in the session its
  wall time shared equally among the kernels it gave rows for, not a measurement of each) and ``session_seconds``
  (the session's wall time, the same in every row).

A kernel that fails (ncu's error, the driver's failed check, no launch matched, a required metric missing, a time
limit) becomes a row whose ``status`` starts with 'failed:' and gives the first line of the error; the others go on.

Remember what ncu does to a kernel: it locks the clocks to their base value and empties the caches before each of
its replay passes, so its times are slower than the book's timed runs and its DRAM bytes are cold-cache bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpulab import SRC
from gpulab.ch18_flash_attention_and_counters import driver
from gpulab.core import counters, flops, kernel_mode
from gpulab.core.provenance import experiment
from gpulab.core.validation import positive_int

KERNELS = driver.NAMES  # every kernel the driver knows, in the book's order
TIMEOUT_S = 300.0  # one kernel's ncu run, start to end
SESSION_EXTRA_S = 60.0  # the session's limit: this plus TIMEOUT_S per kernel (no kernel gets less time than alone)
NCU_ENV = "GPULAB_NCU"  # the ncu executable to use, when it is not the one on the PATH
NCU_PLACES = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")  # where CUDA installs put it
DRIVER_CODE = (driver.main,)  # the code the subprocess runs, for the recording's fingerprint (runs= below)
EXAMPLE_KERNEL = "sgemm_shared"  # the kernel of NCU_COMMAND_EXAMPLE
SESSION_CSV = "kernels.csv"  # the session's CSV file, in SESSION_COMMAND_EXAMPLE
_NCU_OPTIONS_WITH_VALUE = ("--metrics", "--kernel-name", "--launch-skip", "--launch-count", "--log-file",
                           "--profile-from-start")
_STAGES_WITHOUT_LAUNCH = ("prepare", "warmup")  # a session kernel that failed there made no profiled launch
_WIDTH = 100  # command_text's lines

def command_text(command: Sequence[str]) -> str:
    """An ncu command line as a reader types it: shell-quoted, each ncu option with a value on a line of its own,
    and the profiled program on the last line."""
    words = [shlex.quote(word) for word in command]
    lines, i = [[words[0]]], 1
    while i < len(command) and command[i].startswith("--"):
        if command[i] in _NCU_OPTIONS_WITH_VALUE:
            lines.append(words[i:i + 2])
            i += 2
        else:
            lines[-1].append(words[i])
            i += 1
    program: list[str] = []
    for word in words[i:]:  # the program's line, wrapped where it is long (a session names many kernels)
        if program and len(" ".join([*program, word])) > _WIDTH:
            lines.append(program)
            program = []
        program.append(word)
    lines.append(program)
    return " \\\n    ".join(" ".join(line) for line in lines if line)


def driver_arguments(name: str, size: int | None = None, warmup: int = driver.WARMUP) -> list[str]:
    """What follows ``python`` in the command: the driver's module and its arguments."""
    arguments = ["-m", driver.MODULE, name]
    return [*arguments, *(["--size", str(size)] if size is not None else []), "--warmup", str(warmup)]


def profile_command(name: str, size: int | None = None, warmup: int = driver.WARMUP,
                    output_csv: str | Path | None = None, *, python: str = sys.executable,
                    ncu: str = "ncu") -> list[str]:
    """The ncu command line that profiles kernel ``name``'s launch after its ``warmup`` launches."""
    spec = driver.kernel(name)
    return counters.ncu_command(driver_arguments(spec.name, size, warmup), spec.regex, launch_skip=warmup,
                                output_csv=output_csv, python=python, ncu=ncu)


NCU_COMMAND_EXAMPLE = command_text(profile_command(EXAMPLE_KERNEL, 4096, output_csv=f"{EXAMPLE_KERNEL}.csv",
                                                   python="python"))


def session_regex(names: Sequence[str]) -> str:
    """The union of the kernels' :attr:`.driver.Kernel.regex` (each once, in order): ncu's ``--kernel-name`` in a
    session, so that a launch of no kernel asked for (a library's helper inside a bracket) is not profiled."""
    return "|".join(dict.fromkeys(driver.kernel(name).regex for name in names))


def session_arguments(names: Sequence[str], sizes: Mapping[str, int] | None = None,
                      warmup: int = driver.WARMUP) -> list[str]:
    """What follows ``python`` in the session's command: the driver's session mode and its arguments."""
    sizes = sizes or {}
    given = ",".join(f"{name}={sizes[name]}" for name in names if name in sizes)
    return ["-m", driver.MODULE, "--session", *names, *(["--sizes", given] if given else []), "--warmup", str(warmup)]


def session_command(names: Sequence[str], sizes: Mapping[str, int] | None = None, warmup: int = driver.WARMUP,
                    output_csv: str | Path | None = None, *, python: str = sys.executable,
                    ncu: str = "ncu") -> list[str]:
    """The ncu command line that profiles each of ``names``' bracketed launch in one run of the driver's session
    mode: ``--profile-from-start off``, no ``--launch-skip`` nor ``--launch-count``."""
    names = check_kernels(names)
    return counters.ncu_command(session_arguments(names, sizes, warmup), session_regex(names), launch_count=None,
                                output_csv=output_csv, python=python, ncu=ncu, profile_from_start=False)


def find_ncu() -> str:
    """The path of Nsight Compute's command line, ``ncu``: ``$GPULAB_NCU``, else the PATH's, else where CUDA puts it.
    Raises :class:`gpulab.core.kernel_mode.MissingPackage` in one sentence when there is none."""
    for candidate in (os.environ.get(NCU_ENV), shutil.which("ncu"), *NCU_PLACES):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise kernel_mode.MissingPackage(
        "profile_kernels: Nsight Compute's command line (ncu) is not on the PATH; install Nsight Compute (it comes "
        f"with the CUDA toolkit) or set {NCU_ENV} to the ncu executable")


def check_kernels(kernels: object) -> list[str]:
    """``kernels`` as a list of known, distinct names; ValueError naming the argument otherwise."""
    if isinstance(kernels, str) or not isinstance(kernels, Sequence) or not kernels:
        raise ValueError(f"kernels: a non-empty list of kernel names (some of profiled.KERNELS), got {kernels!r}")
    unknown = [k for k in kernels if k not in KERNELS]
    if unknown:
        raise ValueError(f"kernels: unknown {unknown}; choose from {', '.join(KERNELS)}")
    if len(set(kernels)) != len(kernels):
        raise ValueError(f"kernels: each kernel once, got {list(kernels)}")
    return list(kernels)


def check_sizes(sizes: object, kernels: Sequence[str]) -> dict[str, int]:
    """``sizes`` ({kernel: size}, for some of ``kernels``) checked; ValueError naming the argument otherwise."""
    if sizes is None:
        return {}
    if not isinstance(sizes, Mapping):
        raise ValueError(f"sizes: a mapping of kernel name to size, got {sizes!r}")
    stray = [k for k in sizes if k not in kernels]
    if stray:
        raise ValueError(f"sizes: {stray} are not among the kernels profiled ({', '.join(kernels)})")
    return {k: positive_int(f"sizes[{k!r}]", v) for k, v in sizes.items()}


SESSION_COMMAND_EXAMPLE = command_text(session_command(KERNELS, output_csv=SESSION_CSV, python="python"))


@dataclass(frozen=True)
class Finished:
    """What a subprocess left: its exit status (None when it ran out of time) and what it printed."""

    returncode: int | None
    stdout: str
    stderr: str


def _stop(process: subprocess.Popen) -> None:
    """Stop ncu and the driver it started (they share a process group): politely, then not."""
    for sig in (signal.SIGTERM, signal.SIGKILL):  # SIGKILL as well: the driver may outlive ncu's own exit
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def execute(command: Sequence[str], timeout_s: float) -> Finished:
    """Run ``command`` with gpulab importable, wait at most ``timeout_s`` seconds (then stop it and all it started)."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [environment.get("PYTHONPATH")])])
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=environment, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop(process)
        stdout, stderr = process.communicate()
        return Finished(None, stdout, stderr)
    return Finished(process.returncode, stdout, stderr)


def _messages(text: str | None, kind: str) -> list[str]:
    """ncu's ``==ERROR==`` or ``==WARNING==`` lines of ``text``, without the prefix (with ``--log-file`` ncu writes
    them to that file, not to its stdout)."""
    prefix = f"=={kind}=="
    return [line.strip().removeprefix(prefix).strip() for line in (text or "").splitlines()
            if line.strip().startswith(prefix)]


def error_line(finished: Finished, log_text: str | None = None) -> str:
    """The first line of what went wrong: ncu's first ``==ERROR==`` (in its log or its output), else the exception a
    Python traceback ends with, else the first line printed on stderr, else the exit status."""
    errors = _messages(log_text, "ERROR") + _messages(finished.stderr, "ERROR") + _messages(finished.stdout, "ERROR")
    if errors:
        return errors[0]
    stderr = [line.strip() for line in finished.stderr.splitlines() if line.strip()]
    if any(line.startswith("Traceback") for line in stderr):
        return stderr[-1]
    return stderr[0] if stderr else f"exit status {finished.returncode}"


def _reports(stdout: str) -> list[dict | None]:
    """Every :data:`.driver.MARKER` line of ``stdout`` in order, parsed (None for one that is not a JSON object)."""
    found: list[dict | None] = []
    for line in stdout.splitlines():
        if line.startswith(driver.MARKER):
            try:
                report = json.loads(line[len(driver.MARKER):])
            except ValueError:
                report = None
            found.append(report if isinstance(report, dict) else None)
    return found


def _report(stdout: str) -> dict | None:
    """The driver's report (the line after :data:`.driver.MARKER`), or None (also for a line that is not JSON)."""
    for line in stdout.splitlines():
        if line.startswith(driver.MARKER):
            try:
                found = json.loads(line[len(driver.MARKER):])
            except ValueError:
                return None
            return found if isinstance(found, dict) and "relative_error" in found else None
    return None


def comparison(row: dict, cost: flops.Cost) -> dict:
    """:func:`gpulab.core.counters.compare_counts` of a parsed launch against the book's ``cost``; a kernel with no
    arithmetic in the book's count is compared on its bytes only (its FLOP ratio is None)."""
    if cost.flops > 0:
        return counters.compare_counts(row, cost.flops, cost.bytes)
    by_bytes = counters.compare_counts({**row, "flops": 1.0}, 1.0, cost.bytes)
    return {**by_bytes, "flops_ratio": None, "flops_within": None}


def _failure(finished: Finished, log_text: str | None, regex: str, warmup: int, seconds: float) -> str | None:
    """Why a kernel's ncu run gave no counters to trust, in one line; None if it did."""
    if finished.returncode is None:
        return f"ran past its time limit ({seconds:.0f} s) and was stopped"
    if finished.returncode != 0 or _messages(log_text, "ERROR"):
        return error_line(finished, log_text)
    if _report(finished.stdout) is None:
        return "the driver printed no report (it did not reach its check)"
    if not log_text or '"ID",' not in log_text:
        warnings = _messages(log_text, "WARNING") + _messages(finished.stdout, "WARNING")
        return (f"ncu profiled no launch matching {regex!r} after skipping {warmup}"
                + (f" ({warnings[0]})" if warnings else ""))
    return None


def kernel_row(name: str, size: int, warmup: int, finished: Finished, log_text: str | None, seconds: float) -> dict:
    """The row of kernel ``name`` from its ncu run (``log_text``: the file ncu wrote, None if it wrote none): the
    counters, the roofline point, the book's counts, or a status 'failed: ...' with the first line of the error."""
    spec = driver.kernel(name)
    row = _row_start(spec, size, warmup, seconds, "own process")
    failure = _failure(finished, log_text, spec.regex, warmup, seconds)
    if failure is not None:
        return {**row, "status": f"failed: {failure}"}
    try:
        return {**row, **_measured(counters.parse_csv(log_text)[0], spec.cost(size)),
                "relative_error": _report(finished.stdout)["relative_error"], "status": "ok"}
    except ValueError as error:  # malformed CSV, a required metric missing, a launch of no time
        return {**row, "status": f"failed: {error}"}


def _row_start(spec: driver.Kernel, size: int, warmup: int, seconds: float, profiled_in: str) -> dict:
    return {"kernel": spec.name, "label": spec.label, "chapter": spec.chapter, "dtype": spec.dtype, "size": size,
            "size_means": spec.size_means, "warmup": warmup, "profile_seconds": seconds, "profiled_in": profiled_in}


def session_row(name: str, size: int, warmup: int, report: dict, launch: dict, seconds: float) -> dict:
    """The row of kernel ``name`` from its launch in the session (``launch``: a row of
    :func:`gpulab.core.counters.parse_csv`; ``report``: the driver's, with the relative error of its check)."""
    spec = driver.kernel(name)
    row = _row_start(spec, size, warmup, seconds, "session")
    try:
        return {**row, **_measured(launch, spec.cost(size)), "relative_error": report["relative_error"],
                "status": "ok"}
    except ValueError as error:  # a launch of no time
        return {**row, "status": f"failed: {error}"}


def _fits(report: dict | None, name: str, size: int, warmup: int) -> bool:
    """Whether ``report`` is the driver's session report of kernel ``name`` at ``size`` and ``warmup``."""
    if not isinstance(report, dict) or (report.get("kernel"), report.get("size"), report.get("warmup")) != (
            name, size, warmup):
        return False
    error = report.get("relative_error")
    if isinstance(error, int | float) and not isinstance(error, bool):
        return True
    return isinstance(report.get("error"), str) and report.get("stage") in ("prepare", "warmup", "launch", "check")


def assign(names: Sequence[str], sizes: Mapping[str, int], warmup: int, reports: Sequence[dict | None],
           launches: Sequence[dict]) -> dict[str, tuple[dict, dict]]:
    """``{kernel: (report, launch)}`` for the kernels whose launch in the session is certain; the others are left
    out (and profiled again in a process of their own).

    ``names``: the kernels in the order the session ran them, ``sizes`` every one's size; ``reports``: the driver's
    :data:`.driver.MARKER` lines in order (fewer than ``names`` when the session crashed or ran out of time part-way);
    ``launches``: :func:`gpulab.core.counters.parse_csv`'s rows, in the order ncu profiled them. Each report accounts
    for a number of launches: one for a checked kernel and one whose check failed (the launch was made; it gets no
    row), none for one that failed before its bracket (``prepare``, ``warmup``), and an unknown 0 or 1 for one that
    failed inside it (``launch``) and for the kernel the session died in. At most one count may be unknown; the
    launches must add up exactly, and each must match its own kernel's regex (``re.search`` on ncu's name, as ncu
    applies ``regex:``). Anything else (a report out of order or malformed, a count that does not add up, a name
    that does not match) leaves every kernel out: rows are never guessed.
    """
    counts: list[int | None] = []
    for i, report in enumerate(reports):
        if i >= len(names) or not _fits(report, names[i], sizes[names[i]], warmup):
            return {}
        if "relative_error" in report or report["stage"] == "check":
            counts.append(1)
        else:
            counts.append(0 if report["stage"] in _STAGES_WITHOUT_LAUNCH else None)
    if len(reports) < len(names):
        counts.append(None)  # the kernel the session was running when it died: its launch made or not
    unknown = [i for i, count in enumerate(counts) if count is None]
    spare = len(launches) - sum(count for count in counts if count is not None)
    if len(unknown) > 1 or spare not in ((0, 1) if unknown else (0,)):
        return {}
    if unknown:
        counts[unknown[0]] = spare
    certain, cursor = {}, 0
    for i, count in enumerate(counts):
        taken = launches[cursor:cursor + count]
        cursor += count
        if not all(re.search(driver.kernel(names[i]).regex, str(launch.get("kernel", ""))) for launch in taken):
            return {}
        if i < len(reports) and "relative_error" in reports[i]:
            certain[names[i]] = (reports[i], taken[0])
    return certain


def _measured(launch: dict, cost: flops.Cost) -> dict:
    """A parsed launch's counters, its roofline point and its comparison with the book's ``cost``."""
    point = counters.counter_point(launch)
    compared = comparison(launch, cost)
    kept = {key: value for key, value in launch.items() if key not in ("id", "kernel", "top_stalls")}
    return {"ncu_kernel": launch["kernel"], **kept,
            "top_stalls": [[reason, value] for reason, value in launch["top_stalls"]],
            "flops_per_s": point["flops_per_s"], "gflops": point["gflops"],
            "intensity": point["intensity"] if launch["dram_bytes"] > 0 else None,
            "intensity_l2": point["intensity_l2"], "dram_gbytes_per_s": launch["dram_bytes"] / launch["seconds"] / 1e9,
            "book_flops": cost.flops, "book_bytes": cost.bytes,
            **{key: compared[key] for key in ("flops_ratio", "bytes_ratio", "flops_within", "bytes_within")}}


def profile_one(name: str, size: int | None, warmup: int, ncu: str, folder: Path, timeout_s: float) -> dict:
    """Profile kernel ``name`` in one ncu run (its CSV written in ``folder``) and return its row."""
    spec = driver.kernel(name)
    size = spec.size if size is None else size
    csv_path = folder / f"{spec.name}.csv"
    command = profile_command(spec.name, size, warmup, csv_path, ncu=ncu)
    start = time.perf_counter()
    finished = execute(command, timeout_s)
    seconds = time.perf_counter() - start
    log_text = csv_path.read_text(errors="replace") if csv_path.is_file() else None
    return kernel_row(spec.name, size, warmup, finished, log_text, seconds)


def _session_failure(finished: Finished, log_text: str | None, names: Sequence[str],
                     launches: list | None) -> str | None:
    """ncu's first error when the driver ran every kernel (a report each) but ncu profiled none of them: ncu cannot
    profile on this machine (no access to the counters...), and a process per kernel would only say so again."""
    errors = _messages(log_text, "ERROR") + _messages(finished.stderr, "ERROR") + _messages(finished.stdout, "ERROR")
    if launches == [] and errors and len(_reports(finished.stdout)) == len(names):
        return errors[0]
    return None


def profile_session(kernels: Sequence[str], sizes: Mapping[str, int], warmup: int, ncu: str, folder: Path,
                    timeout_s: float) -> list[dict]:
    """Profile ``kernels`` in one ncu session (its CSV written in ``folder``), then each kernel the session gives
    no certain row for (:func:`assign`) in a process of its own (:func:`profile_one`); a row per kernel, in order."""
    resolved = {name: sizes.get(name, driver.kernel(name).size) for name in kernels}
    csv_path = folder / SESSION_CSV
    command = session_command(kernels, sizes, warmup, csv_path, ncu=ncu)
    start = time.perf_counter()
    finished = execute(command, SESSION_EXTRA_S + len(kernels) * timeout_s)
    seconds = time.perf_counter() - start
    log_text = csv_path.read_text(errors="replace") if csv_path.is_file() else None
    try:
        launches = counters.parse_csv(log_text) if log_text and '"ID",' in log_text else []
    except ValueError:  # a launch lacks a required metric, malformed text: each kernel's own run says which
        launches = None
    certain = {} if launches is None else assign(kernels, resolved, warmup, _reports(finished.stdout), launches)
    failure = _session_failure(finished, log_text, kernels, launches)
    rows = []
    for name in kernels:
        if name in certain:
            row = session_row(name, resolved[name], warmup, *certain[name], seconds / len(certain))
        elif failure is not None:
            row = {**_row_start(driver.kernel(name), resolved[name], warmup, seconds / len(kernels), "session"),
                   "status": f"failed: {failure}"}
        else:
            row = profile_one(name, sizes.get(name), warmup, ncu, folder, timeout_s)
        rows.append({**row, "session_seconds": seconds})
    return rows


@experiment("kernel_counters", runs=("DRIVER_CODE",))
def profile_kernels(kernels: Sequence[str] = KERNELS, sizes: Mapping[str, int] | None = None,
                    warmup: int = driver.WARMUP, timeout_s: float = TIMEOUT_S) -> list[dict]:
    """Profile ``kernels`` with Nsight Compute in one session (:data:`SESSION_COMMAND_EXAMPLE`), each kernel it
    gives no certain row for in a run of its own (:data:`NCU_COMMAND_EXAMPLE`), and return a row per kernel (see the
    module's docstring). GPU and ncu only.

    ``sizes``: {kernel: size} for the kernels not to run at their default size (:attr:`.driver.Kernel.size_means`
    says what a size is); ``warmup``: the launches before the profiled one; ``timeout_s``: one kernel's limit (the
    session's: :data:`SESSION_EXTRA_S` plus ``timeout_s`` per kernel).
    """
    kernels = check_kernels(kernels)
    sizes = check_sizes(sizes, kernels)
    warmup = driver.check_warmup(warmup)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise ValueError(f"timeout_s: a number of seconds > 0, got {timeout_s!r}")
    kernel_mode.require_gpu("profile_kernels")
    ncu = find_ncu()
    with tempfile.TemporaryDirectory(prefix="gpulab_ncu_") as folder:
        return profile_session(kernels, sizes, warmup, ncu, Path(folder), timeout_s)
