"""`make gpu-run`: on a GPU machine, execute every notebook at full size and refresh the recordings.

Each chapter and lab solution runs under papermill with its default (full) parameters and
``GPULAB_RECORD=1``, so every experiment it runs live saves ``results/<gpu>/<experiment>.json``. The time of each
notebook, and of its slowest cells, goes to ``results/<gpu>/gpu_run/<profile>.json`` (the book's predicted times are
checked against it). ``--profile class`` runs the class profile instead (``PROFILE = "class"``: sizes a class can
wait for), which records only its times; the labs, which have one size, run only with the full profile.
The executed notebooks go to ``_build/gpu-run/``; a notebook that fails is reported and the run goes on
with the next (its earlier cells' recordings are saved). While one notebook runs, the next one's kernel starts and
imports what every notebook imports (``tools/warm_kernel.py``): a notebook's time is its cells' and papermill's,
and the notebooks' times add up to the run's. The notebooks that do no GPU work and save no recording
(:func:`alongside`: four labs, and chapter 16 on a machine of one GPU) run one after another in a process of their own
beside chapter 18 or 17, whose recorded numbers are GPU times; the run waits for them before the next notebook,
and the recording's total counts that wait, so it is the notebooks' wall time. papermill writes each executed
notebook once, when it ends (a notebook whose kernel dies leaves none).
Then what needs a real GPU besides the notebooks:
every GPU-only unit test (``pytest -m gpu``, the tests marked ``needs_gpu``), the timing-fidelity benchmark
(``gpulab.core.timing`` against ``triton.testing.do_bench``, the two taking turns over 20 rounds; the run fails
if their medians differ by more than 3% for a copy, or 5% for a matmul at the power limit: :data:`TOLERANCE`), and
a sweep that must survive a genuine CUDA out-of-memory error.

    python tools/gpu_run.py                 # everything
    python tools/gpu_run.py 03 lab_07       # only the notebooks whose names contain 03 or lab_07, then the checks
    python tools/gpu_run.py --no-notebooks  # only the GPU unit tests and the checks
    python tools/gpu_run.py --profile class --no-checks   # the class profile's times, nothing else
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import nbformat  # noqa: E402
import papermill  # noqa: E402
import torch  # noqa: E402
from warm_kernel import WarmKernel  # noqa: E402

from gpulab.core import env, rates, recordings, timing  # noqa: E402
from gpulab.core.banner import banner  # noqa: E402
from gpulab.core.sweep import OUT_OF_MEMORY, run_sweep  # noqa: E402

# How far the two timers' medians may differ, by the work's first word. The copy runs well below the power limit, and
# they agree within 3%. The matmul holds the GPU at its power limit, where its time follows the share of the time the
# GPU spends on it (its duty), which each timer's flushes between calls set: on an H100 (2026-11-26, 8 rounds in turns)
# cuBLAS's float16 matmul of 4096^3 read 6.7% faster than do_bench (duty 0.70) with two 256 MiB flushes before each
# call (duty 0.52), and 6.4% slower back to back (0.99), while gpulab's own timer (two flushes of 100 MiB, 0.74)
# read 0.05% faster. gpulab's flush count follows the host's time to queue a call, so its duty moves with the host:
# on a 4-GPU H100 machine it read the matmul 3.2% faster over 20 rounds (17 of them faster). So the matmul's limit is
# 5%; a broken timer (no synchronisation, a wrong unit) misses by far more.
TOLERANCE = {"matmul": 0.05, "copy": 0.03}
# On an H200 at its power limit, single pairs of the matmul disagreed by up to 5.7%, and the medians of six
# rounds by up to 2.7%: more rounds (about a second each) shrink the noise of the medians.
FIDELITY_ROUNDS = 20
# Notebooks with no GPU work and no recording (host NumPy and torch, gloo on the host), run beside the chapter named
# by the key: chapters 17 and 18 spend their time in GPU kernels, Triton's compiler and Nsight Compute, and record
# GPU times only, which a process on other cores leaves alone (the machines have 16 or more).
ALONGSIDE = {"18_flash_attention_and_counters": ("01_peak_rates_and_precision", "04_im2col_convolution",
                                                 "05_lstm_by_hand", "11_all_reduce")}
# Chapter 16 measures NCCL live only on a machine of two GPUs or more; on one GPU it runs gloo on the host and draws
# the recordings, so it runs beside chapter 17 there.
ALONGSIDE_ON_ONE_GPU = {"17_hopper_tensor_cores": ("16_distributed_training",)}


def alongside(gpus: int) -> dict[str, tuple[str, ...]]:
    """{a chapter's stem: the notebooks run beside it} on a machine of ``gpus`` GPUs."""
    return {**ALONGSIDE, **(ALONGSIDE_ON_ONE_GPU if gpus < 2 else {})}


def sweep_survives_out_of_memory() -> bool:
    """A sweep point that really exhausts GPU memory becomes an 'out of memory' row, and the next point runs."""
    _free, total = torch.cuda.mem_get_info()
    n = int((total / 4 / 1.5) ** 0.5)  # one float32 n x n matrix fills two thirds of the card: the second fails
    points = [{"op": "gemm", "n": n, "dtype": "float32"}, {"op": "gemm", "n": 1024, "dtype": "float32"}]
    with mock.patch("gpulab.core.validation.available_memory", return_value=None):  # skip the pre-check
        rows = run_sweep(rates.measure_blas, points)
    print(f"\nOut-of-memory check: gemm at n = {n:,}: {rows[0]['status']}; then n = 1024: {rows[1]['status']}")
    return [row["status"] for row in rows] == [OUT_OF_MEMORY, "ok"]


def gpu_unit_tests() -> bool:
    """Run every unit test marked ``gpu`` (tests/conftest.py's ``needs_gpu``) on this GPU; True if all passed."""
    print("\nGPU-only unit tests (pytest -m gpu):", flush=True)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs",
                             str(ROOT / "tests" / "unit")], cwd=ROOT)
    return result.returncode == 0


def slowest_cells(path: Path, count: int = 8) -> list[dict]:
    """The ``count`` slowest cells of an executed notebook: their index, seconds and first line."""
    cells = [(i, c.metadata.get("papermill", {}).get("duration") or 0.0, c.source.strip().splitlines()[:1])
             for i, c in enumerate(nbformat.read(path, as_version=4).cells) if c.cell_type == "code"]
    return [{"cell": i, "seconds": round(t, 2), "first_line": (line or [""])[0][:100]}
            for i, t, line in sorted(cells, key=lambda c: -c[1])[:count]]


def fidelity_limit(work: str) -> float:
    """How far the two timers may differ on ``work`` (a ``timing_fidelity`` row's name): :data:`TOLERANCE` of its
    first word."""
    return TOLERANCE[work.split()[0]]


def fidelity_beyond(rows: list[dict]) -> list[str]:
    """The works of a ``timing_fidelity`` recording whose timers differ by more than their :func:`fidelity_limit`."""
    return [row["work"] for row in rows if abs(row["difference"]) > fidelity_limit(row["work"])]


def total_seconds(times: list[dict]) -> float:
    """The notebooks' wall time: the notebooks run one after another, plus any wait for those run beside them (a
    notebook run beside another took none of its own)."""
    return round(sum(t["seconds"] + t.get("waited_for_alongside_seconds", 0.0) for t in times
                     if not t.get("alongside")), 1)


def save_times(profile: str, times: list[dict]) -> Path:
    """``results/<gpu>/gpu_run/<profile>.json``: each notebook's seconds and slowest cells, with the machine. Saved
    after every notebook, so that a run cut short keeps what it measured; a run of some notebooks replaces their
    entries and keeps the others'."""
    info = env.describe()
    folder = recordings.results_dir() / env.slugify(info.name) / "gpu_run"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{profile}.json"
    kept = json.loads(path.read_text())["notebooks"] if path.exists() else []
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    # each entry says when and at which commit it ran: the kept ones may come from an earlier run
    times = [{"git_commit": os.environ.get("GPULAB_GIT_COMMIT"), "date": when, **t} for t in times]
    ran = {t["notebook"] for t in times}
    times = sorted([t for t in kept if t["notebook"] not in ran] + times, key=lambda t: t["notebook"])
    path.write_text(json.dumps({
        "profile": profile, "total_seconds": total_seconds(times), "notebooks": times,
        "device": info.as_dict(), "date": when, "git_commit": os.environ.get("GPULAB_GIT_COMMIT"),
    }, indent=1) + "\n")
    return path


# papermill's arguments for every notebook the run executes. Each executed notebook is written once, at the end or
# with the error: papermill's default, a write before and after every cell, took 4.5 s of chapter 04's SMOKE run on
# the build machine, and more at full size
PAPERMILL_ARGUMENTS = {"progress_bar": False, "request_save_on_cell_execute": False}
_PAPERMILL = ("import json, sys, papermill; papermill.execute_notebook(sys.argv[1], sys.argv[2], cwd=sys.argv[3], "
              "kernel_name='python3', **json.loads(sys.argv[4]))")


def time_entry(path: Path, out: Path, seconds: float, status: str, **more) -> dict:
    """A notebook's entry in the time recording: its path in the repository, its seconds and status, and the slowest
    cells of its executed copy in ``out`` (none where it left no copy)."""
    executed = out / path.name
    return {"notebook": path.relative_to(ROOT).as_posix(), "seconds": round(seconds, 1), "status": status, **more,
            "slowest_cells": slowest_cells(executed) if executed.exists() else []}


class Alongside(threading.Thread):
    """Runs ``notebooks`` one after another, each under papermill in a Python process of its own, and keeps a time
    entry for each (marked as run beside ``host``, a notebook's path in the repository). A chapter gets ``profile``
    as its ``PROFILE``; a lab has one size."""

    def __init__(self, notebooks: list[Path], out: Path, host: str, profile: str = "full"):
        super().__init__(daemon=True)
        self.notebooks, self.out, self.host, self.profile = notebooks, out, host, profile
        self.times, self.failed = [], []

    def run(self) -> None:
        for path in self.notebooks:
            start = time.perf_counter()
            parameters = {"PROFILE": self.profile} if path.parent.name == "notebooks" else {}
            arguments = {**PAPERMILL_ARGUMENTS, "parameters": parameters}
            done = subprocess.run([sys.executable, "-c", _PAPERMILL, str(path), str(self.out / path.name),
                                   str(path.parent), json.dumps(arguments)], capture_output=True, text=True)
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            status = "ok" if done.returncode == 0 else f"FAILED: {lines[-1] if lines else done.returncode}"
            if done.returncode:
                self.failed.append(path.name)
            self.times.append(time_entry(path, self.out, time.perf_counter() - start, status, alongside=self.host))


def split_alongside(notebooks: list[Path], gpus: int = 1) -> tuple[list[Path], dict[str, list[Path]]]:
    """The notebooks to run one after another, and {host notebook's stem: the notebooks to run beside it} on a machine
    of ``gpus`` GPUs (:func:`alongside`). A notebook whose host is not run this time runs in the sequence."""
    stems = {path.stem for path in notebooks}
    beside = {host: [path for path in notebooks if path.stem in guests]
              for host, guests in alongside(gpus).items() if host in stems}
    moved = {path for paths in beside.values() for path in paths}
    return [path for path in notebooks if path not in moved], {h: p for h, p in beside.items() if p}


def run_notebooks(notebooks: list[Path], out: Path, profile: str) -> tuple[list[str], list[dict]]:
    """Run each notebook with papermill into ``out``, saving the times after each; the names of those that failed,
    and the times. Each runs on a kernel started while the one before it ran (:class:`warm_kernel.WarmKernel`);
    those of :func:`alongside` run beside their host notebook (:class:`Alongside`)."""
    notebooks, beside = split_alongside(notebooks, torch.cuda.device_count())
    failed, times, run_start = [], [], time.perf_counter()
    warm = WarmKernel(notebooks[0].parent) if notebooks else None
    try:
        for index, path in enumerate(notebooks):
            kernel = warm
            # the next notebook's kernel starts and imports while this one runs
            warm = WarmKernel(notebooks[index + 1].parent) if index + 1 < len(notebooks) else None
            side = (Alongside(beside[path.stem], out, path.relative_to(ROOT).as_posix(), profile)
                    if path.stem in beside else None)
            start = time.perf_counter()
            if side is not None:
                side.start()
            try:  # a failing notebook keeps the recordings its earlier cells saved, and the next one still runs
                kernel.execute(path, out / path.name, cwd=str(path.parent), parameters={"PROFILE": profile},
                               **PAPERMILL_ARGUMENTS)
                status = "ok"
            except papermill.PapermillExecutionError as error:
                failed.append(path.name)
                status = f"FAILED in cell {error.exec_count}: {error.ename}: {error.evalue}"
            except Exception as error:  # the kernel died (a crash in CUDA, say): the next notebook has its own
                failed.append(path.name)
                status = f"FAILED: {type(error).__name__}: {error}"
            finally:
                kernel.close()
            seconds = time.perf_counter() - start
            entry = time_entry(path, out, seconds, status)
            print(f"{path.relative_to(ROOT)}: {seconds:6.1f} s  {status}", flush=True)
            if side is not None:
                waited = time.perf_counter()
                side.join()
                entry["waited_for_alongside_seconds"] = round(time.perf_counter() - waited, 1)
                failed += side.failed
                for t in side.times:
                    print(f"{t['notebook']}: {t['seconds']:6.1f} s  {t['status']} (beside {path.stem})", flush=True)
            times += [entry, *(side.times if side is not None else [])]
            written = save_times(profile, times)
    finally:
        if warm is not None:  # interrupted: the kernel started for the next notebook
            warm.close()
    if times:
        print(f"notebooks: {total_seconds(times):.0f} s in all ({time.perf_counter() - run_start:.0f} s "
              f"from the first kernel's start); times in {written}")
    return failed, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", help="run only the notebooks whose file names contain one of these")
    parser.add_argument("--no-notebooks", action="store_true", help="skip the notebooks: tests and checks only")
    parser.add_argument("--no-checks", action="store_true", help="skip the GPU unit tests and the checks")
    parser.add_argument("--profile", choices=("full", "class"), default="full",
                        help="the notebooks' sizes: full (recorded) or class (times only)")
    args = parser.parse_args()
    if not env.has_gpu():
        print("make gpu-run needs a CUDA GPU; this machine has none.")
        return 2
    if args.profile == "full":
        os.environ["GPULAB_RECORD"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    print(banner(), flush=True)
    out = ROOT / "_build" / "gpu-run" / args.profile
    out.mkdir(parents=True, exist_ok=True)
    notebooks = [] if args.no_notebooks else sorted(ROOT.glob("notebooks/*.ipynb"))
    if args.profile == "full" and not args.no_notebooks:  # the labs have one size: they run with the full profile
        notebooks += sorted(ROOT.glob("labs/solutions/*.ipynb"))
    notebooks = [path for path in notebooks if not args.only or any(name in path.name for name in args.only)]
    failed, _ = run_notebooks(notebooks, out, args.profile)
    if args.no_checks:
        return 1 if failed else 0

    if not gpu_unit_tests():
        failed.append("GPU unit tests")
    # saved, as GPULAB_RECORD=1
    fidelity = recordings.run("timing_fidelity", timing.compare_with_do_bench, rounds=FIDELITY_ROUNDS)
    print(f"\nTiming fidelity on {fidelity.device_name} (medians):")
    print(f"{'work':>24} {'gpulab.core.timing':>18} {'do_bench':>12} {'difference':>11}  {'single rounds':>17}")
    for row in fidelity.rows:
        low, high = min(row["round_differences"]), max(row["round_differences"])
        print(f"{row['work']:>24} {row['gpulab_seconds'] * 1e3:15.4f} ms {row['do_bench_seconds'] * 1e3:9.4f} ms "
              f"{row['difference']:+10.2%}  {low:+.2%} to {high:+.2%}")
    beyond = fidelity_beyond(fidelity.rows)
    if beyond:
        failed.append("timing fidelity")
    print(f"{'FAIL' if beyond else 'OK'}: " + "; ".join(
        f"{row['work']} {row['difference']:+.1%} (limit {fidelity_limit(row['work']):.0%})"
        for row in fidelity.rows))
    if not sweep_survives_out_of_memory():
        print("FAIL: the sweep did not turn a CUDA out-of-memory error into a row")
        failed.append("out-of-memory sweep")
    if failed:
        print(f"FAILED: {', '.join(failed)} (executed notebooks, with their errors, are in {out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
