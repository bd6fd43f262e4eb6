"""The all-reduce lab's graders: the chunk bookkeeping, a ring's probe results, and rings run on gloo processes."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from gpulab.ch16_distributed_training import distributed
from gpulab.labs import grading
from gpulab.labs.lab11_all_reduce import diagnose
from gpulab.labs.lab11_all_reduce.diagnose import Diagnosis, RingRun
from gpulab.labs.lab11_all_reduce.ring import REFERENCE, probe_vector, ring_sent_bytes

# ---------------------------------------------------------------------------------------------
# Exercise 1: the bookkeeping


@pytest.mark.parametrize(("reduce_scatter", "all_gather", "problem"), [
    (distributed.reduce_scatter_chunks, distributed.all_gather_chunks, "ok"),
    (lambda r, s, p: None, distributed.all_gather_chunks, "not a chunk"),
    (lambda r, s, p: (r - s, r - s - 1), distributed.all_gather_chunks, "not a chunk"),  # no % p
    (lambda r, s, p: ((r - s) % p, (r - s) % p), distributed.all_gather_chunks, "mismatch"),
    (lambda r, s, p: ((r + s) % p, (r + s - 1) % p), distributed.all_gather_chunks, "not reduced"),
    (lambda r, s, p: (r, (r - 1) % p), distributed.all_gather_chunks, "counted twice"),
    (distributed.reduce_scatter_chunks, lambda r, s, p: ((r - s) % p, (r - s - 1) % p), "incomplete chunk sent"),
    (distributed.reduce_scatter_chunks, lambda r, s, p: ((r + 1) % p, r), "not gathered"),
    (lambda r, s, p: 1 / 0, distributed.all_gather_chunks, "error"),
])
def test_schedule_mistakes_are_named(reduce_scatter, all_gather, problem):
    diagnosis = diagnose.diagnose_schedule(reduce_scatter, all_gather)
    assert diagnosis.problem == problem, diagnosis


def test_schedule_details_say_where():
    mismatch = diagnose.diagnose_schedule(lambda r, s, p: ((r - s) % p, (r - s) % p),
                                                  distributed.all_gather_chunks)
    assert mismatch.detail == ("with p = 2, at reduce-scatter step 0, worker 1 sends chunk 1 to worker 0, which "
                               "receives it as chunk 0")
    twice = diagnose.diagnose_schedule(lambda r, s, p: (r, (r - 1) % p), distributed.all_gather_chunks)
    assert "adds worker(s) [2]'s values to its chunk 2, which holds them already" in twice.detail


# ---------------------------------------------------------------------------------------------
# Exercise 2, read from outcomes: the probe's digits


def _outcome(values, rank, case=0, **extra):
    return {"case": case, "rank": rank, "elements": len(values), "probe": [float(v) for v in values],
            "random_error": 0.0, "sent_bytes": 0, "returned": "none", **extra}


def _probe_run(p, n, rounds, case=0):
    """Every rank's outcome of a simulated ring (rounds of distributed.Message) on the probe vectors."""
    vectors = [probe_vector(n, rank, p).numpy().astype(np.float64) for rank in range(p)]
    return {rank: _outcome(result, rank, case) for rank, result in
            enumerate(distributed.simulate(vectors, rounds).results)}


def _run(p, cases, per_case, **extra):
    outcomes = {rank: [per_case[i][rank] for i in range(len(per_case))] for rank in range(p)}
    return RingRun(p, list(cases), outcomes, {}, **extra)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_probe_of_a_right_ring_passes_and_its_mistakes_are_named(p):
    n = 4 * p + 1
    ring = distributed.ring_rounds(n, p)
    assert diagnose.diagnose_run(_run(p, [n], [_probe_run(p, n, ring)])).ok
    no_gather = _probe_run(p, n, ring[:p - 1])
    assert diagnose.diagnose_run(_run(p, [n], [no_gather])).problem == "no all-gather"
    added = [[_adding(m) for m in round_] for round_ in ring]
    assert diagnose.diagnose_run(_run(p, [n], [_probe_run(p, n, added)])).problem == "added twice"
    assert diagnose.diagnose_run(_run(p, [n], [_probe_run(p, n, [])])).problem == "unchanged"


def _adding(message):
    """The message, added by its receiver: in the all-gather, instead of overwriting."""
    return distributed.Message(message.source, message.target, message.start, message.stop, add=True)


def test_probe_diagnoses_from_the_values():
    p, total = 3, 1 + 4 + 16
    assert diagnose.diagnose_probe(_outcome([total] * 5, 1), p) is None
    assert diagnose.diagnose_probe(_outcome([total / 3] * 5, 1), p).problem == "averaged"
    returned = _outcome([4] * 5, 1, returned_probe=[total] * 5)  # the sum, returned; the tensor left alone
    assert diagnose.diagnose_probe(returned, p).problem == "not in place"
    missing = diagnose.diagnose_probe(_outcome([total, total, 1 + 16, total, total], 1), p)
    assert missing == Diagnosis("missing contributions", "process 1's element 2 (chunk 1) lacks process(es) [1]'s "
                                                         "values")
    assert diagnose.diagnose_probe(_outcome([total, 0.5, total], 0), p).problem == "wrong values"
    assert diagnose.diagnose_probe(_outcome([total, 2 * total, total], 0), p).problem == "added twice"


def test_run_diagnoses_uneven_chunks_errors_and_crashes():
    p = 2
    even, uneven = _probe_run(p, 8, distributed.ring_rounds(8, p)), _probe_run(p, 9, distributed.ring_rounds(9, p), 1)
    for rank in range(p):
        uneven[rank]["probe"][-1] = float(3**rank)  # the last element never reached: chunks of n // p
    diagnosis = diagnose.diagnose_run(_run(p, [8, 9], [even, uneven]))
    assert diagnosis.problem == "uneven chunks" and "elements 8 to 8 of 9" in diagnosis.detail
    deadlock = {r: _outcome([], r, error="RuntimeError: [pair.cc:1] Timed out waiting 10000ms for send operation",
                            timed_out=True) for r in range(p)}
    assert diagnose.diagnose_run(_run(p, [8], [deadlock])) == Diagnosis(
        "deadlock", "with p = 2 processes and a vector of 8 elements: process 0 stopped: Timed out waiting 10000ms for "
                    "send operation")
    crashed = RingRun(p, [8], {0: [_outcome([], 0, error="RuntimeError: Connection reset by peer")]}, {},
                      stderr="op.preamble.length <= op.nbytes. Received data size doesn't match expected size.")
    assert diagnose.diagnose_run(crashed).problem == "chunk sizes differ"
    wrong = {r: {**even[r], "random_error": 0.3} for r in range(p)}
    assert diagnose.diagnose_run(_run(p, [8], [wrong])).problem == "wrong values"
    tuple_error = {r: _outcome([], r, error="TypeError: 'tuple' object does not support item assignment")
                   for r in range(p)}
    assert "list(torch.tensor_split" in diagnose.diagnose_run(_run(p, [8], [tuple_error])).detail
    loading = RingRun(p, [8], {}, {0: "Traceback...\nSyntaxError: expected ':'"})
    assert diagnose.diagnose_run(loading) == Diagnosis("error", "with p = 2, process 0: SyntaxError: "
                                                                        "expected ':'")


def test_traffic_is_bandwidth_optimal_to_the_element():
    for p, n in ((2, 9), (3, 3001), (4, 3)):
        total = sum(ring_sent_bytes(n, p, rank) for rank in range(p))
        run = distributed.simulate([np.zeros(n, np.float32)] * p, distributed.ring_rounds(n, p))
        assert total == sum(run.sent_bytes)
        assert [ring_sent_bytes(n, p, r) for r in range(p)] == run.sent_bytes
    p, n = 3, 3001
    right = _probe_run(p, n, distributed.ring_rounds(n, p))

    def run_sending(sent):
        return _run(p, [n], [{r: {**right[r], "sent_bytes": sent(r)} for r in range(p)}])

    assert diagnose.diagnose_traffic([run_sending(lambda r: ring_sent_bytes(n, p, r))]).ok
    naive = diagnose.diagnose_traffic([run_sending(lambda r: 2 * 4 * n)])
    assert naive.problem == "not bandwidth optimal" and "2 times its size" in naive.detail
    unchanged = _run(p, [n], [_probe_run(p, n, [])])
    assert "does not pass exercise 2 yet" in diagnose.diagnose_traffic([unchanged]).detail
    assert diagnose.diagnose_traffic([]).problem == "ring first"


def test_every_problem_has_a_hint_and_diagnoses_grade():
    assert set(diagnose.HINTS) == set(diagnose.PROBLEMS) - {"ok"}
    with pytest.raises(ValueError, match="^problem:"):
        Diagnosis("race", "not an all-reduce problem")
    assert not grading.grade(grading.Grader(strict=False), "ring", Diagnosis("deadlock", "x"),
                                   diagnose.HINTS)


# ---------------------------------------------------------------------------------------------
# Exercise 2, for real: rings on gloo processes (a few seconds each: torch starts in every process)

HEADER = "import torch\nimport torch.distributed as dist\n\n\n"


def _ring_file(tmp_path, body: str) -> str:
    path = tmp_path / "ring.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return f"{path}:ring_all_reduce"


def test_the_reference_ring_passes_and_sends_the_optimal_bytes():
    diagnosis, runs = diagnose.grade_ring(REFERENCE, workers=(2, 3))
    assert diagnosis.ok, diagnosis
    assert [run.workers for run in runs] == [2, 3]
    assert diagnose.diagnose_traffic(runs).ok


def test_blocking_sends_deadlock_and_the_grader_says_so(tmp_path):
    target = _ring_file(tmp_path, """
        def ring_all_reduce(tensor):
            p, r = dist.get_world_size(), dist.get_rank()
            incoming = torch.empty_like(tensor)
            dist.send(tensor, (r + 1) % p)  # everyone sends first: gloo's send waits for the receive
            dist.recv(incoming, (r - 1) % p)
            tensor += incoming
    """)
    diagnosis, _ = diagnose.grade_ring(target, workers=(2,), collective_timeout_s=2)
    assert diagnosis.problem == "deadlock", diagnosis


def test_chunks_of_different_sizes_crash_and_collectives_are_refused(tmp_path):
    target = _ring_file(tmp_path, """
        def ring_all_reduce(tensor):
            p, r = dist.get_world_size(), dist.get_rank()
            chunks = list(torch.tensor_split(tensor, p))
            for s in range(p - 1):
                incoming = torch.empty_like(chunks[(r - s) % p])  # the size of the chunk sent, not received
                requests = [dist.isend(chunks[(r - s) % p], (r + 1) % p), dist.irecv(incoming, (r - 1) % p)]
                for request in requests:
                    request.wait()
                chunks[(r - s - 1) % p] += incoming
            for s in range(p - 1):
                incoming = torch.empty_like(chunks[(r + 1 - s) % p])
                requests = [dist.isend(chunks[(r + 1 - s) % p], (r + 1) % p), dist.irecv(incoming, (r - 1) % p)]
                for request in requests:
                    request.wait()
                chunks[(r - s) % p].copy_(incoming)
    """)
    diagnosis, _ = diagnose.grade_ring(target, workers=(2,), collective_timeout_s=5)
    assert diagnosis.problem == "chunk sizes differ" and "9 elements" in diagnosis.detail, diagnosis
    target = _ring_file(tmp_path, """
        def ring_all_reduce(tensor):
            dist.all_reduce(tensor)
    """)
    diagnosis, _ = diagnose.grade_ring(target, workers=(2,), collective_timeout_s=5)
    assert diagnosis.problem == "collective used" and "dist.all_reduce was called" in diagnosis.detail


def test_time_ring_rows():
    rows = diagnose.time_ring(REFERENCE, 2, [64, 4096], warmup=1, least=3, most=3)
    assert [r["bytes"] for r in rows] == [64, 4096]
    for r in rows:
        assert r["ring_sent_bytes"] == r["bytes"]  # p = 2: each process sends half in each phase
        assert r["ring_seconds"] > 0 and r["all_reduce_busbw_gbs"] > 0 and r["workers"] == 2
