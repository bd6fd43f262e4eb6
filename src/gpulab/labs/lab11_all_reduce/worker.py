"""What each worker process of the lab runs under torchrun: ``python -m gpulab.labs.lab11_all_reduce.worker
grade|time ...`` grades the student's ring on the probe and on fresh random data, or times it beside
``dist.all_reduce``, and writes one JSON line per case for :mod:`.diagnose` to read.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from gpulab.ch16_distributed_training.ddp import _max_over_ranks
from gpulab.core import timing
from gpulab.labs.lab11_all_reduce.ring import CollectiveUsed, load_function, point_to_point_only, probe_vector

CPU = torch.device("cpu")  # the lab's processes run gloo on the CPU
COLLECTIVE_TIMEOUT_S = 10.0  # gloo's limit on one send, receive or collective: a deadlock errors after this


def _kind(value: object) -> str:
    return "none" if value is None else "tensor" if isinstance(value, torch.Tensor) else type(value).__name__


def _grade_task(function: Callable, folder: Path, cases: Sequence[int], seed: int) -> None:
    """Each case: the probe, then fresh random data against dist.all_reduce; one JSON line per case."""
    rank, p = dist.get_rank(), dist.get_world_size()
    real_all_reduce = dist.all_reduce
    with open(folder / f"rank{rank}.jsonl", "w") as log:
        for index, elements in enumerate(cases):
            outcome: dict = {"case": index, "elements": elements, "rank": rank}
            try:
                probe = probe_vector(elements, rank, p)
                with point_to_point_only():
                    returned = function(probe)
                outcome["returned"] = _kind(returned)
                outcome["probe"] = probe.tolist()
                if isinstance(returned, torch.Tensor) and returned.shape == probe.shape:
                    outcome["returned_probe"] = returned.detach().float().tolist()
                generator = torch.Generator().manual_seed(seed * 1009 + index * 31 + rank)
                values = torch.randn(elements, generator=generator)
                reference = values.clone()
                real_all_reduce(reference)
                with point_to_point_only() as traffic:
                    function(values)
                outcome["sent_bytes"] = traffic["sent_bytes"]
                outcome["messages"] = traffic["messages"]
                gap = torch.linalg.vector_norm(values.double() - reference.double())
                scale = torch.linalg.vector_norm(reference.double()).item() or 1.0
                outcome["random_error"] = gap.item() / scale if torch.isfinite(values).all() else float("nan")
            except Exception as error:  # the student's code: reported, and the run stops (the group may be broken)
                outcome["error"] = f"{type(error).__name__}: {error}"
                outcome["collective"] = isinstance(error, CollectiveUsed)
                outcome["timed_out"] = "timed out" in str(error).lower() or "timeout" in str(error).lower()
                log.write(json.dumps(outcome) + "\n")
                log.flush()
                os._exit(0)  # at once: a neighbour may be stuck waiting for this process
            log.write(json.dumps(outcome) + "\n")
            log.flush()
            dist.barrier()  # the next case starts together: no message of this one is still under way


def _time_task(function: Callable, folder: Path, sizes: Sequence[int], warmup: int, budget_bytes: int,
               least: int, most: int, seed: int) -> None:
    """For each size: the median time of the student's ring and of dist.all_reduce (the slowest rank's, each call
    started together), and the bytes the ring sent."""
    rank = dist.get_rank()
    rows = []
    for nbytes in sizes:
        elements = max(1, nbytes // 4)
        generator = torch.Generator().manual_seed(seed + rank)
        values = torch.randn(elements, generator=generator)
        repeats = max(least, min(most, budget_bytes // (elements * 4)))
        with point_to_point_only() as traffic:
            function(values)
        row = {"bytes": elements * 4, "elements": elements, "repeats": repeats,
               "ring_sent_bytes": _max_over_ranks(traffic["sent_bytes"], CPU)}
        for name, fn in (("ring", function), ("all_reduce", dist.all_reduce)):
            measured = _timed_calls(lambda fn=fn, values=values: fn(values), warmup, repeats)
            row[f"{name}_seconds"] = _max_over_ranks(measured.median_s, CPU)
            row[f"{name}_spread"] = _max_over_ranks(measured.spread, CPU)
        rows.append(row)
    if rank == 0:
        (folder / "timing.json").write_text(json.dumps(rows))


def _timed_calls(call: Callable[[], object], warmup: int, repeats: int) -> timing.Timing:
    """Wall times of ``repeats`` calls, each started by all ranks together (a barrier before each, not timed).

    Unlike :func:`gpulab.core.timing.measure`, the calls are not back to back: on gloo's TCP transport, point-to-point
    calls that follow each other without a pause can each wait milliseconds for the network stack (seen on
    loopback, for kilobyte messages), which would time the operating system rather than the algorithm.
    """
    for _ in range(warmup):
        dist.barrier()
        call()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return timing.Timing(tuple(samples))


def main(argv: Sequence[str] | None = None) -> int:
    """A worker's entry point under torchrun: ``python -m gpulab.labs.lab11_all_reduce grade|time --target ...``."""
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("task", choices=("grade", "time"))
    parser.add_argument("--target", required=True, help="file.py:function or module:function")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", default="{}")
    parser.add_argument("--collective-timeout", type=float, default=COLLECTIVE_TIMEOUT_S)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout))
        function = load_function(args.target)
        task = _grade_task if args.task == "grade" else _time_task
        task(function, args.out, **json.loads(args.params))
    except Exception:  # loading the student's file, or timing it
        (args.out / f"rank{rank}.error").write_text(traceback.format_exc())
        os._exit(0)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
