"""Graders for the lab "All-reduce": a student's ring all-reduce, run on real processes, and what went wrong.

The lab has three parts, and each has a grader that names the usual mistake instead of saying "wrong":

1. **The chunk bookkeeping** (:func:`diagnose_schedule`): the student's ``reduce_scatter_chunks(rank,
   step, p)`` and ``all_gather_chunks(rank, step, p)`` return the chunk a worker sends to its right
   neighbour and the chunk it receives from its left one. The grader follows, for p = 2 to 8, which
   workers' values every chunk of every worker holds, as sets: a receiver that expects another chunk
   than its neighbour sends, a chunk that gets a worker's values twice, a reduce-scatter that leaves
   no worker with a complete chunk, or an all-gather that passes on an incomplete one, is named.
2. **The ring all-reduce** over ``torch.distributed`` point-to-point calls (:func:`grade_ring`). The student's
   function runs in separate processes, started by torchrun
   (:func:`gpulab.ch16_distributed_training.launch.launch`): a notebook's functions cannot be sent to other
   processes, so the lab writes the student's cell to a file (``%%writefile``) and every process imports it from
   there (:func:`.ring.load_function`). Each process runs it on a *probe* first -- worker w's vector holds (p + 1)^w
   everywhere, so a sum is a number in base p + 1 whose digits count each worker's contributions -- and then on
   fresh random data, compared with ``dist.all_reduce``. The digits tell a missing all-gather (one complete chunk
   per worker) from an added-twice chunk or a missing contribution (an off-by-one chunk index); chunk lengths that
   do not divide evenly fail only the uneven cases. The collectives are switched off while the student's code runs
   (it must use send and receive), and the sends are counted. A ring where every process sends first with a blocking
   ``dist.send`` deadlocks (gloo's send waits for the matching receive): the process group's time limit turns that
   into an error, and the launcher's into a stopped run, so the notebook never hangs.
3. **Bandwidth** (:func:`diagnose_traffic`): a ring is bandwidth-optimal when each process sends
   2 (p - 1) / p times the vector's bytes {patarasuk2009bandwidth}; the counted sends say whether it did.
   :func:`time_ring` times the student's ring and ``dist.all_reduce`` on gloo for the lab's figure.

Nothing here raises on a student's mistake: it becomes a :class:`Diagnosis`, which
:func:`gpulab.labs.grading.grade` records as a lab check.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpulab.ch16_distributed_training import distributed, launch
from gpulab.core.validation import positive_int, positive_ints
from gpulab.labs import grading
from gpulab.labs.lab11_all_reduce import worker
from gpulab.labs.lab11_all_reduce.ring import exercise_cases, ring_sent_bytes
from gpulab.labs.lab11_all_reduce.worker import COLLECTIVE_TIMEOUT_S

PROBLEMS = ("ok", "error",
            # exercise 1: the bookkeeping
            "not a chunk", "mismatch", "counted twice", "not reduced", "incomplete chunk sent", "not gathered",
            # exercise 2: the ring on processes
            "deadlock", "timeout", "crashed", "collective used", "chunk sizes differ", "unchanged", "not in place",
            "averaged", "no all-gather", "added twice", "missing contributions", "uneven chunks", "empty chunks",
            "wrong values",
            # exercise 3: bandwidth
            "ring first", "not bandwidth optimal")

HINTS = {
    "error": "read the error above: it came from your code",
    "not a chunk": "return a pair of chunk numbers (send, receive), each between 0 and p - 1: use % p",
    "mismatch": "what worker r receives at a step is what its left neighbour r - 1 sends at that step: the "
                "receive formula is the send formula with r - 1 in place of r",
    "counted twice": "a worker must add each other worker's values to a chunk once: at reduce-scatter step s, "
                     "send the chunk you added to at step s - 1 (at step 0, your own chunk r): send (r - s) % p, "
                     "receive (r - s - 1) % p",
    "not reduced": "the partial sums must travel around the ring: at each step send the chunk you received and "
                   "added to at the step before; then after p - 1 steps worker r holds the complete chunk "
                   "(r + 1) % p",
    "incomplete chunk sent": "the all-gather starts from the complete chunk reduce-scatter left on worker r, "
                             "(r + 1) % p, and passes on the chunk it received at the step before: send "
                             "(r + 1 - s) % p, receive (r - s) % p",
    "not gathered": "p - 1 all-gather steps must bring every complete chunk to every worker: each step, pass on "
                    "the chunk received at the step before",
    "deadlock": "every process waited for another: gloo's blocking dist.send returns only once the matching "
                "dist.recv has started, and every process sent first. Start the send and the receive together: "
                "req = dist.isend(...); dist.irecv(...).wait(); req.wait() -- or let even ranks send first and odd "
                "ranks receive first",
    "timeout": "your function never returned (an endless loop, or waiting for a message nobody sends): each "
               "phase has p - 1 steps, with one send and one receive per step",
    "crashed": "a process died: read its last words above",
    "collective used": "build the all-reduce from point-to-point messages: dist.isend / dist.irecv (or "
                       "dist.send / dist.recv) with your right and left neighbours; the collectives are off here",
    "chunk sizes differ": "a process received a chunk of another length than its neighbour sent: both sides "
                          "must cut the vector the same way, e.g. chunks = torch.tensor_split(tensor, p), and the "
                          "receive buffer must have the length of the chunk it receives (torch.empty_like(chunks[i]))",
    "unchanged": "nothing was added to it: ring_all_reduce must sum into the tensor it is given, in place, like "
                 "dist.all_reduce -- write into views of its chunks (chunk.add_(incoming) in reduce-scatter, "
                 "chunk.copy_(incoming) in all-gather)",
    "not in place": "the sum was returned, but the tensor passed in was left unchanged: dist.all_reduce works in "
                    "place, and so must yours. torch.tensor_split gives views, so chunks[i].add_(x) writes the tensor; "
                    "chunks[i] = chunks[i] + x makes a new tensor instead",
    "averaged": "all-reduce sums: do not divide by p (DDP divides the summed gradients afterwards)",
    "no all-gather": "after reduce-scatter each process holds one complete chunk; the p - 1 all-gather steps then "
                     "pass the complete chunks around the ring, each receiver overwriting its own copy",
    "added twice": "in the all-gather a received chunk is already the full sum: overwrite (chunk.copy_(incoming)), "
                   "do not add; in reduce-scatter add each step's incoming chunk exactly once",
    "missing contributions": "a chunk index is off: at reduce-scatter step s, send chunk (r - s) % p and add the "
                             "incoming one to chunk (r - s - 1) % p; at all-gather step s, send (r + 1 - s) % p and "
                             "overwrite (r - s) % p",
    "uneven chunks": "the vector's length need not be a multiple of p: cut it with torch.tensor_split(tensor, p) "
                     "(chunk lengths differ by at most one) rather than a fixed length n // p",
    "empty chunks": "with fewer elements than processes some chunks are empty; torch.tensor_split handles that, "
                    "and sending or receiving an empty chunk is fine",
    "wrong values": "the structure is right but the values are not: add in the tensor's own dtype (float32), "
                    "and receive into a fresh buffer (torch.empty_like) rather than into the chunk you are sending",
    "ring first": "make exercise 2's check pass first: the bytes of a wrong all-reduce mean nothing",
    "not bandwidth optimal": "each process should send exactly its p - 1 reduce-scatter chunks and p - 1 all-gather "
                             "chunks, 2 (p - 1) / p of the vector: send chunks, never the whole vector",
}


TOLERANCE = 1e-5  # relative to dist.all_reduce's sum: float32 sums of a few terms in another order
EXERCISE_WORKERS = (2, 3, 4)


@dataclass(frozen=True)
class Diagnosis(grading.Diagnosis):
    """What a student's bookkeeping or ring did: ``problem`` is one of :data:`PROBLEMS`, ``detail`` says where."""

    def __post_init__(self) -> None:
        if self.problem not in PROBLEMS:
            raise ValueError(f"problem: one of {PROBLEMS}, got {self.problem!r}")






def diagnose_schedule(reduce_scatter: Callable[[int, int, int], tuple[int, int]],
                      all_gather: Callable[[int, int, int], tuple[int, int]],
                      workers: Sequence[int] = (2, 3, 4, 5, 8)) -> Diagnosis:
    """Follow a ring all-reduce whose chunks are chosen by the two functions, for each worker count.

    ``holds[r][c]`` is the set of workers whose values chunk ``c`` of worker ``r`` contains; it starts as
    ``{r}``. Each step every worker sends its chosen chunk to the right; the receiver adds the set
    (reduce-scatter) or replaces its own with it (all-gather). In the end every chunk of every worker
    must hold every worker's values.
    """
    try:
        for p in positive_ints("workers", workers):
            found = _follow_schedule(reduce_scatter, all_gather, p)
            if found is not None:
                return found
    except Exception as error:  # the student's functions may fail in any way
        return Diagnosis("error", f"{type(error).__name__}: {error}")
    return Diagnosis("ok", f"for p = {', '.join(map(str, workers))}, every worker ends with every chunk summed "
                           "over all workers, each worker's values counted once")


def _chunk_pair(fn: Callable, rank: int, step: int, p: int, phase: str) -> tuple[int, int] | Diagnosis:
    pair = fn(rank, step, p)
    try:
        send, receive = pair
        ok = all(isinstance(c, int | np.integer) and 0 <= c < p for c in (send, receive))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        return Diagnosis("not a chunk", f"{phase}: for rank {rank}, step {step}, p = {p} your function returned "
                                        f"{pair!r}, not two chunk numbers between 0 and {p - 1}")
    return int(send), int(receive)


def _follow_schedule(reduce_scatter: Callable, all_gather: Callable, p: int) -> Diagnosis | None:
    everyone = frozenset(range(p))
    holds = [[frozenset({r}) for _ in range(p)] for r in range(p)]
    for phase, fn, add in (("reduce-scatter", reduce_scatter, True), ("all-gather", all_gather, False)):
        for step in range(p - 1):
            plan = {}
            for r in range(p):
                pair = _chunk_pair(fn, r, step, p, phase)
                if isinstance(pair, Diagnosis):
                    return pair
                plan[r] = pair
            where = f"with p = {p}, at {phase} step {step}"
            for r in range(p):
                left = (r - 1) % p
                if plan[r][1] != plan[left][0]:
                    return Diagnosis("mismatch", f"{where}, worker {left} sends chunk {plan[left][0]} to worker {r}, "
                                                 f"which receives it as chunk {plan[r][1]}")
            before = [list(row) for row in holds]
            for r in range(p):
                left, chunk = (r - 1) % p, plan[r][1]
                incoming = before[left][chunk]
                if add:
                    if incoming & before[r][chunk]:
                        twice = sorted(incoming & before[r][chunk])
                        return Diagnosis("counted twice", f"{where}, worker {r} adds worker(s) {twice}'s values to "
                                                          f"its chunk {chunk}, which holds them already")
                    holds[r][chunk] = incoming | before[r][chunk]
                else:
                    if incoming != everyone:
                        return Diagnosis("incomplete chunk sent",
                                         f"{where}, worker {left} sends chunk {chunk}, which holds only worker(s) "
                                         f"{sorted(incoming)}'s values: it is not summed over all {p} yet")
                    holds[r][chunk] = incoming
        if add:
            lacking = [r for r in range(p) if everyone not in holds[r]]
            if lacking:
                best = max(len(s) for s in holds[lacking[0]])
                return Diagnosis("not reduced", f"with p = {p}, after reduce-scatter worker {lacking[0]} holds no "
                                                f"chunk summed over all {p} workers (the fullest has {best})")
    for r in range(p):
        for chunk in range(p):
            if holds[r][chunk] != everyone:
                return Diagnosis("not gathered", f"with p = {p}, after all-gather chunk {chunk} of worker {r} holds "
                                                 f"only worker(s) {sorted(holds[r][chunk])}'s values")
    return None


@dataclass
class RingRun:
    """One grading run of a ring on ``workers`` processes: each rank's outcomes, case by case, and the launch."""

    workers: int
    cases: list[int]
    outcomes: dict[int, list[dict]]
    errors: dict[int, str]  # a rank's traceback from loading or running outside the cases
    stderr: str = ""
    launch_failed: bool = False
    timed_out: bool = False


def run_ring(target: str, workers: int, cases: Sequence[int] | None = None, *, seed: int = 0,
             collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, timeout_s: float = 120.0) -> RingRun:
    """Run the ring ``target`` (see :func:`.ring.load_function`) on ``workers`` gloo processes, case by case."""
    p = positive_int("workers", workers)
    cases = list(cases if cases is not None else exercise_cases(p))
    with tempfile.TemporaryDirectory(prefix="gpulab_ring_") as folder:
        arguments = ["-m", worker.__name__, "grade", "--target", target, "--out", folder, "--collective-timeout",
                     str(collective_timeout_s), "--params", json.dumps({"cases": cases, "seed": seed})]
        run = RingRun(p, cases, {}, {})
        try:
            launch.launch(arguments, p, timeout_s=timeout_s)
        except launch.LaunchError as error:
            run.launch_failed, run.timed_out, run.stderr = True, error.timed_out, error.stderr
        for path in Path(folder).glob("rank*.jsonl"):
            run.outcomes[int(path.stem[4:])] = [json.loads(line) for line in path.read_text().splitlines() if line]
        for path in Path(folder).glob("rank*.error"):
            run.errors[int(path.stem[4:])] = path.read_text()
    return run


def _diagnose_failure(failed: Mapping[int, dict], where: str, fewer_than_workers: bool) -> Diagnosis:
    """The most telling of the ranks' errors in one case: a collective, a deadlock, then the first error that
    is not merely a neighbour's connection closing."""
    used = [o for o in failed.values() if o.get("collective")]
    if used:
        return Diagnosis("collective used", f"{where}: {used[0]['error'].split(': ', 1)[-1]}")
    waited = sorted((rank, o) for rank, o in failed.items() if o.get("timed_out"))
    if waited:
        rank, outcome = waited[0]
        message = re.sub(r"^\[[^\]]*\]\s*", "", outcome["error"].split(": ", 1)[-1])  # gloo's source location
        return Diagnosis("deadlock", f"{where}: process {rank} stopped: {message}")
    secondary = ("closed", "reset by peer")  # a neighbour died or gave up first
    primary = sorted((rank, o) for rank, o in failed.items() if not any(w in o["error"].lower() for w in secondary))
    rank, outcome = (primary or sorted(failed.items()))[0]
    if fewer_than_workers:
        return Diagnosis("empty chunks", f"{where} (fewer elements than processes), process {rank}: {outcome['error']}")
    advice = ""
    if "'tuple' object does not support item assignment" in outcome["error"]:
        advice = (" (torch.tensor_split returns a tuple: make it a list, chunks = list(torch.tensor_split(tensor, p)), "
                  "or add in place with chunks[i].add_(incoming))")
    return Diagnosis("error", f"{where}, process {rank}: {outcome['error']}{advice}")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing)"


def diagnose_run(run: RingRun) -> Diagnosis:
    """Read a :class:`RingRun`: the first case that went wrong on some rank, and what its probe shows."""
    p = run.workers
    if run.errors and not run.outcomes:  # the file did not load, or failed before the first case
        rank = min(run.errors)
        return Diagnosis("error", f"with p = {p}, process {rank}: {_last_line(run.errors[rank])}")
    for index, elements in enumerate(run.cases):
        results = {rank: outcomes[index] for rank, outcomes in run.outcomes.items() if len(outcomes) > index}
        where = f"with p = {p} processes and a vector of {elements} element{'s' * (elements != 1)}"
        failed = {rank: o for rank, o in results.items() if "error" in o}
        sizes_differ = "doesn't match expected size" in run.stderr or "preamble.length" in run.stderr
        if sizes_differ and (failed or len(results) < p):  # gloo aborts the receiver; its neighbours lose a peer
            return Diagnosis("chunk sizes differ", f"{where}: a process received a message of another size than it "
                                                   "expected, and gloo stopped it")
        if failed:
            return _diagnose_failure(failed, where, elements < p)
        if len(results) < p:
            if run.timed_out:
                return Diagnosis("timeout", f"{where}: the processes did not finish in time and were stopped")
            if run.errors:
                rank = min(run.errors)
                return Diagnosis("error", f"{where}, process {rank}: {_last_line(run.errors[rank])}")
            return Diagnosis("crashed", f"{where}: {p - len(results)} process(es) died: {_last_line(run.stderr)}")
        even_passed = any(n % p == 0 for n in run.cases[:index])  # cases run in order: the earlier ones passed
        for rank in sorted(results):
            found = diagnose_probe(results[rank], p)
            if found is not None:
                if elements % p and even_passed and elements >= p:
                    return Diagnosis("uneven chunks", f"{where}, not a multiple of {p} (the multiples passed): "
                                                      f"{_wrong_elements(results[rank], p)}")
                if elements < p:
                    return Diagnosis("empty chunks", f"{where} (fewer elements than processes): {found.detail}")
                return Diagnosis(found.problem, f"{where}: {found.detail}")
        errors = {rank: o["random_error"] for rank, o in results.items()}
        rank, error = max(errors.items(), key=lambda item: -1 if math.isnan(item[1]) else item[1])
        if not all(e <= TOLERANCE for e in errors.values()):
            return Diagnosis("wrong values", f"{where}: on fresh random data, process {rank}'s result is off "
                                             f"dist.all_reduce's by a relative {error:.3g} (the probe was right)")
    if len(run.outcomes) < p or run.launch_failed:
        return Diagnosis("crashed", f"with p = {p}: {_last_line(run.stderr)}")
    return Diagnosis("ok", f"with p = {p}, vectors of {', '.join(map(str, run.cases))} elements: every process "
                           "holds dist.all_reduce's sum")


def diagnose_probe(outcome: Mapping, workers: int) -> Diagnosis | None:
    """What a rank's probe result says (see the module's docstring), or None if it holds the exact sum."""
    p, rank = workers, outcome["rank"]
    base = p + 1
    values = np.asarray(outcome["probe"], dtype=np.float64)
    total = float(sum(base**q for q in range(p)))
    own = float(base**rank)
    if values.size == 0:
        return None
    if np.all(values == total):
        return None
    if np.all(values == own):
        returned = outcome.get("returned_probe")
        if returned is not None and np.allclose(returned, total):
            return Diagnosis("not in place", f"process {rank} returned the sum but left its tensor unchanged")
        return Diagnosis("unchanged", f"process {rank}'s tensor still holds only its own values")
    if np.allclose(values, total / p):
        return Diagnosis("averaged", f"process {rank} holds the sum divided by {p}")
    if not (np.all(np.isfinite(values)) and np.all(values == np.round(values)) and np.all(values >= 0)):
        bad = int(np.argmax(~np.isfinite(values) | (values != np.round(values)) | (values < 0)))
        return Diagnosis("wrong values", f"process {rank}'s element {bad} is {values[bad]:g}, not a sum of the "
                                         "processes' values")
    counts = np.stack([(values // base**q) % base for q in range(p)], axis=1).astype(int)  # elements x workers
    if np.any(values >= base**p):
        counts[values >= base**p] = base  # larger than any sum of each worker once: some worker's values repeat
    bounds = distributed.chunk_bounds(values.size, p)
    if np.any(counts > 1):
        element = int(np.argmax((counts > 1).any(axis=1)))
        twice = [q for q in range(p) if counts[element, q] > 1]
        return Diagnosis("added twice", f"process {rank}'s element {element} (chunk {_chunk_of(element, bounds)}) "
                                        f"holds process(es) {twice}'s values more than once")
    complete = (counts == 1).all(axis=1)
    full_chunks = [c for c, (start, stop) in enumerate(bounds) if stop > start and complete[start:stop].all()]
    nonempty = [c for c, (start, stop) in enumerate(bounds) if stop > start]
    if len(full_chunks) == 1 and len(nonempty) > 1:
        return Diagnosis("no all-gather", f"process {rank} holds the complete sum in chunk {full_chunks[0]} only; "
                                          "its other chunks are partial sums")
    element = int(np.argmin(complete))
    missing = [q for q in range(p) if counts[element, q] == 0]
    return Diagnosis("missing contributions", f"process {rank}'s element {element} (chunk "
                                              f"{_chunk_of(element, bounds)}) lacks process(es) {missing}'s values")


def _wrong_elements(outcome: Mapping, workers: int) -> str:
    """'process 0's elements 8 to 8 of 9 are wrong': where a probe differs from the exact sum."""
    values = np.asarray(outcome["probe"], dtype=np.float64)
    wrong = np.flatnonzero(values != float(sum((workers + 1) ** q for q in range(workers))))
    return (f"process {outcome['rank']}'s elements {wrong.min()} to {wrong.max()} of {values.size} hold wrong sums "
            f"({wrong.size} element{'s' * (wrong.size != 1)})")


def _chunk_of(element: int, bounds: Sequence[tuple[int, int]]) -> int:
    return next(c for c, (start, stop) in enumerate(bounds) if start <= element < stop)


def grade_ring(target: str, workers: Sequence[int] = EXERCISE_WORKERS, *, seed: int = 0,
               collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, timeout_s: float = 120.0
               ) -> tuple[Diagnosis, list[RingRun]]:
    """Grade the ring ``target`` on each worker count in turn, stopping at the first that fails.

    Returns the diagnosis (ok if every count passed) and the runs made, for :func:`diagnose_traffic`.
    Never raises: a failure to launch, or a bug in the grader's own path, becomes an "error" diagnosis.
    """
    runs: list[RingRun] = []
    diagnosis = Diagnosis("error", "nothing was run")
    try:
        for p in positive_ints("workers", workers):
            run = run_ring(target, p, seed=seed, collective_timeout_s=collective_timeout_s, timeout_s=timeout_s)
            runs.append(run)
            diagnosis = diagnose_run(run)
            if not diagnosis.ok:
                break
    except Exception as error:  # a grader reports, never raises
        diagnosis = Diagnosis("error", f"{type(error).__name__}: {error}")
    if diagnosis.ok:
        diagnosis = Diagnosis("ok", f"on {', '.join(str(r.workers) for r in runs)} processes and vectors of "
                                    "every length tried, every process holds dist.all_reduce's sum")
    return diagnosis, runs


def diagnose_traffic(runs: Sequence[RingRun]) -> Diagnosis:
    """Whether every process of the graded runs sent what a bandwidth-optimal ring sends, in the largest case."""
    checked = []
    for run in runs:
        if not diagnose_run(run).ok:
            return Diagnosis("ring first", f"with p = {run.workers} your ring does not pass exercise 2 yet")
        index = max(range(len(run.cases)), key=lambda i: run.cases[i])
        elements = run.cases[index]
        for rank, outcomes in sorted(run.outcomes.items()):
            if len(outcomes) <= index or "sent_bytes" not in outcomes[index]:
                return Diagnosis("error", f"with p = {run.workers}, the case of {elements} elements did not run: "
                                          "your ring must pass exercise 2 first")
            sent, optimal = outcomes[index]["sent_bytes"], ring_sent_bytes(elements, run.workers, rank)
            checked.append(run.workers)
            if sent != optimal:
                size = 4 * elements
                return Diagnosis("not bandwidth optimal",
                                 f"with p = {run.workers}, process {rank} sent {sent:,} bytes for a vector of "
                                 f"{size:,}: {sent / size:.3g} times its size, where a ring sends "
                                 f"{optimal:,} (2 (p - 1) / p = {distributed.ring_factor(run.workers):.3g} times)")
    if not checked:
        return Diagnosis("ring first", "there is no graded run of your ring to read")
    return Diagnosis("ok", f"on {', '.join(map(str, sorted(set(checked))))} processes every process sent exactly "
                           "2 (p - 1) / p of the vector (to the element, for uneven chunks)")


def time_ring(target: str, workers: int, sizes: Sequence[int], *, warmup: int = 3, budget_bytes: int = 64 * 2**20,
              least: int = 5, most: int = 50, seed: int = 0, timeout_s: float = 300.0) -> list[dict]:
    """Time the ring ``target`` and ``dist.all_reduce`` on ``workers`` gloo processes; one row per size (bytes).

    Each call starts on every process together (a barrier before each, not timed). Each row has both medians (the
    slowest rank's), the ring's bytes sent by its busiest process, and nccl-tests' algbw and busbw of both in GB/s.
    Raises :class:`gpulab.ch16_distributed_training.launch.LaunchError` if the run fails.
    """
    sizes = positive_ints("sizes", sizes)
    with tempfile.TemporaryDirectory(prefix="gpulab_ring_") as folder:
        params = {"sizes": sizes, "warmup": warmup, "budget_bytes": budget_bytes, "least": least, "most": most,
                  "seed": seed}
        launch.launch(["-m", worker.__name__, "time", "--target", target, "--out", folder,
                       "--params", json.dumps(params)],
                   positive_int("workers", workers), timeout_s=timeout_s)
        errors = sorted(Path(folder).glob("rank*.error"))
        if errors:
            raise launch.LaunchError(f"timing {target} failed:\n{errors[0].read_text()}", 0, "")
        rows = json.loads((Path(folder) / "timing.json").read_text())
    for row in rows:
        for name in ("ring", "all_reduce"):
            seconds = row[f"{name}_seconds"]
            row[f"{name}_algbw_gbs"] = distributed.algorithm_bandwidth(row["bytes"], seconds) / 1e9
            row[f"{name}_busbw_gbs"] = distributed.bus_bandwidth(row["bytes"], seconds, workers) / 1e9
        row["workers"] = workers
    return rows
