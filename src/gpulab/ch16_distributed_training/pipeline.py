"""Pipeline parallelism: the layers cut into p consecutive stages, one per rank, fed m micro-batches.

Each stage holds some consecutive layers of the model; it receives its input activations from the stage
before (stage 0 reads the data), and sends its output to the stage after (the last stage computes the
loss). The backward pass runs the other way: each stage receives the gradient of its output, and sends
the gradient of its input back. Only activations cross a stage boundary, point to point (``send``/``recv``).

Run one batch through p stages and only one stage works at a time. GPipe {huang2019gpipe} cuts the batch
into m *micro-batches*, so that stage s can work on micro-batch i while stage s + 1 works on i - 1. Its
schedule runs all m forward passes, then all m backward passes (the gradients of the micro-batches add up
to the batch's). Stages still wait at the start (stage s gets its first input after s forward steps) and at
the end (the backward pass drains the same way). With every stage taking the same time per micro-batch,
the idle share of the step, the **bubble**, is

    bubble = (p - 1) / (m + p - 1),

small only when m is much larger than p. *1F1B* (one forward, one backward; PipeDream-Flush
{narayanan2021memory}) runs the same work in another order: after a few forward passes to fill the pipe,
each stage alternates one forward and one backward pass. Its bubble is the same, but a stage keeps the
activations of at most p - s micro-batches waiting for their backward pass instead of all m: less memory
for the same speed.

:func:`timeline` computes either schedule's timeline for given forward and backward times, without
processes (a stage starts an operation when it is free and its input has arrived), so
:func:`bubble_fraction` can be checked against :func:`bubble_formula`. :func:`pipeline_step` runs one
training step on real processes, following the same per-stage order (:func:`stage_order`), and notes
when each stage computes, so that a run's bubble can be measured the same way.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpulab.ch16_distributed_training.tensor_parallel import linear_indices
from gpulab.core import timing
from gpulab.core.validation import positive_int

SCHEDULES = ("gpipe", "1f1b")


def _check(stages: int, micro_batches: int, schedule: str) -> tuple[int, int]:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: one of {', '.join(SCHEDULES)}, got {schedule!r}")
    return positive_int("stages", stages), positive_int("micro_batches", micro_batches)


def stage_order(stage: int, stages: int, micro_batches: int, schedule: str = "gpipe") -> list[tuple[str, int]]:
    """The order in which ``stage`` runs its passes: ('F', i) is micro-batch i's forward pass, ('B', i) its backward.

    GPipe: F0 ... F(m-1), then B0 ... B(m-1). 1F1B: ``p - 1 - stage`` forward passes to fill the pipe (at
    most m), then one forward and one backward in turn, then the backward passes left.
    """
    p, m = _check(stages, micro_batches, schedule)
    if not 0 <= stage < p:
        raise ValueError(f"stage: between 0 and {p - 1}, got {stage}")
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - 1 - stage, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def peak_activations(stage: int, stages: int, micro_batches: int, schedule: str = "gpipe") -> int:
    """The most micro-batches whose activations ``stage`` holds at once (forward done, backward not yet)."""
    held = peak = 0
    for phase, _ in stage_order(stage, stages, micro_batches, schedule):
        held += 1 if phase == "F" else -1
        peak = max(peak, held)
    return peak


def timeline(stages: int, micro_batches: int, schedule: str = "gpipe", forward_time: float = 1.0,
             backward_time: float = 1.0) -> list[dict]:
    """When each stage runs each pass, with every stage taking ``forward_time`` per forward pass of a micro-batch
    and ``backward_time`` per backward pass, and messages taking no time.

    A stage runs its passes in :func:`stage_order`; each starts as soon as the stage is free and its input
    is there: F(s, i) needs F(s - 1, i) done, B(s, i) needs B(s + 1, i) done. One row per pass: stage,
    phase ('forward' or 'backward'), micro_batch, start, end.
    """
    p, m = _check(stages, micro_batches, schedule)
    if not (forward_time > 0 and backward_time > 0):
        raise ValueError(f"forward_time, backward_time: must be > 0, got {forward_time}, {backward_time}")
    orders = [stage_order(s, p, m, schedule) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (phase, stage, micro-batch) -> end time
    position, free, rows = [0] * p, [0.0] * p, []
    while len(rows) < 2 * p * m:
        progressed = False
        for s in range(p):
            while position[s] < 2 * m:
                phase, i = orders[s][position[s]]
                needs = ("F", s - 1, i) if phase == "F" else ("B", s + 1, i)
                if needs[1] in (-1, p):  # stage 0's input is the data; the last stage's gradient its own loss
                    needs = None
                if needs is not None and needs not in done:
                    break
                start = max(free[s], done[needs] if needs else 0.0)
                free[s] = done[(phase, s, i)] = start + (forward_time if phase == "F" else backward_time)
                rows.append({"stage": s, "phase": "forward" if phase == "F" else "backward", "micro_batch": i,
                             "start": start, "end": free[s]})
                position[s] += 1
                progressed = True
        if not progressed:
            raise AssertionError(f"{schedule}: the stages wait for each other forever")
    return sorted(rows, key=lambda r: (r["stage"], r["start"]))


def bubble_formula(stages: int, micro_batches: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of a pipelined step whose stages all take the same time."""
    p, m = positive_int("stages", stages), positive_int("micro_batches", micro_batches)
    return (p - 1) / (m + p - 1)


def bubble_fraction(rows: Sequence[dict]) -> float:
    """The idle share of a timeline (rows with stage, start, end, as :func:`timeline` or a run gives them):
    1 - (time the stages computed) / (stages x the step's span, from the first start to the last end)."""
    if not rows:
        raise ValueError("rows: an empty timeline")
    stages = len({r["stage"] for r in rows})
    span = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    busy = sum(r["end"] - r["start"] for r in rows)
    return 1 - busy / (stages * span)


def stage_bounds(model: torch.nn.Sequential, stages: int) -> list[tuple[int, int]]:
    """Where ``model`` is cut into ``stages`` stages: each stage's (start, stop) positions in the Sequential.

    Each stage takes a run of consecutive linear layers (a ReLU goes with the linear layer before it), at least
    one, and the cuts make the largest stage's weight count as small as it can be: a layer's work per sample is
    proportional to its weights, and the slowest stage sets the pipeline's pace. (Cutting by the number of layers
    would give an MLP of four equal layers and a small classifier three equal layers and one on two GPUs.) Among
    equally good cuts, the earliest. Raises ValueError if there are fewer linear layers than stages.
    """
    linears, p = linear_indices(model), positive_int("stages", stages)
    if len(linears) < p:
        raise ValueError(f"stages: {p} stages need at least {p} linear layers, one per stage; the model has "
                         f"{len(linears)}")
    weights = [model[i].weight.numel() for i in linears]
    firsts = _balanced_cuts(weights, p)
    starts = [linears[first] for first in firsts]
    return list(zip(starts, [*starts[1:], len(model)], strict=True))


def _balanced_cuts(costs: Sequence[int], parts: int) -> list[int]:
    """The first index of each of ``parts`` consecutive non-empty runs of ``costs`` whose largest sum is least."""
    n = len(costs)
    prefix = [0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    # best[k][i]: the least largest sum when the first i costs form k runs; cut[k][i] where the last run starts
    best = [[float("inf")] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                largest = max(best[k - 1][j], prefix[i] - prefix[j])
                if largest < best[k][i]:
                    best[k][i], cut[k][i] = largest, j
    firsts, i = [], n
    for k in range(parts, 0, -1):
        i = cut[k][i]
        firsts.append(i)
    return firsts[::-1]


def stage_module(model: torch.nn.Sequential, stage: int, stages: int) -> torch.nn.Sequential:
    """Stage ``stage``'s layers of ``model`` (the same modules, not copies; the parameters keep their names)."""
    start, stop = stage_bounds(model, stages)[stage]
    return model[start:stop]  # slicing a Sequential keeps each module's name, "2.weight" stays "2.weight"


def sent_bytes(model: torch.nn.Sequential, stages: int, batch: int, itemsize: int = 4) -> list[int]:
    """The bytes each stage sends per step, for a batch of ``batch`` samples (however it is cut into micro-batches):
    its output activations forward (all but the last stage), the gradient of its input backward (all but the first).
    """
    widths = [_widths(stage_module(model, s, stages)) for s in range(stages)]
    return [itemsize * positive_int("batch", batch) * ((outputs if s < stages - 1 else 0) + (inputs if s else 0))
            for s, (inputs, outputs) in enumerate(widths)]


def _widths(module: torch.nn.Sequential) -> tuple[int, int]:
    linears = [m for m in module if isinstance(m, torch.nn.Linear)]
    return linears[0].in_features, linears[-1].out_features


_DIRECTIONS: dict[int, tuple[dist.ProcessGroup, dist.ProcessGroup]] = {}


def _directions() -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Two groups of all the ranks: one carries the activations forward, the other the gradients back.

    NCCL runs the messages of one group between two ranks in order, on one stream. With a single group,
    1F1B's stage s queues "send activation i + 1" before "receive gradient i" while stage s + 1 queues "send
    gradient i" before "receive activation i + 1"; a send larger than NCCL's buffers waits for its receive, so
    each waits for the other forever. With one group per direction, both ends of each queue agree on its order.
    Every rank must call this at the same point (creating a group is collective): :func:`pipeline_step` does.
    """
    world = dist.get_world_size()
    if world not in _DIRECTIONS:
        _DIRECTIONS[world] = (dist.new_group(list(range(world))), dist.new_group(list(range(world))))
    return _DIRECTIONS[world]


def pipeline_step(module: torch.nn.Sequential, X: torch.Tensor | None, labels: torch.Tensor | None,
                  micro_batches: int, schedule: str = "gpipe", batch: int | None = None
                  ) -> tuple[torch.Tensor | None, list[dict]]:
    """One forward and backward pass of the whole batch through the pipeline; this rank is one stage.

    ``module`` is this rank's stage (:func:`stage_module`); stage 0 needs the inputs ``X``, the last stage the
    ``labels``, and the others only the ``batch`` size. The batch is cut into ``micro_batches`` equal
    micro-batches, each stage runs its passes in :func:`stage_order`, and the gradients of the micro-batches
    accumulate in the parameters' ``.grad``. Each micro-batch's loss is divided by their number, so the sum
    is the mean over the batch, as one process would compute it.

    Activations go forward with ``isend`` and gradients back the same way, each direction in its own process
    group (:func:`_directions`): a stage never waits for its message to be taken, only for the messages it
    needs (``recv``), so no order of passes can deadlock. A message is dropped once its send is done (checked
    before each pass): kept to the end of the step, the messages would hold every micro-batch's activations, as
    GPipe does, and 1F1B would save no memory.
    Returns the loss (on the last stage, else None) and the stage's compute intervals (phase, micro_batch,
    start, end in ``time.perf_counter`` seconds, which every process on a machine reads from the same clock).
    """
    rank, stages = dist.get_rank(), dist.get_world_size()
    device = next(module.parameters()).device
    whole = X.shape[0] if X is not None else labels.shape[0] if labels is not None else batch
    m = positive_int("micro_batches", micro_batches)
    if whole is None or whole % m:
        raise ValueError(f"micro_batches: the batch of {whole} samples does not split into {m} equal micro-batches")
    size, (inputs, outputs) = whole // m, _widths(module)
    first, last = rank == 0, rank == stages - 1
    saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # micro-batch -> (stage input, stage output or loss)
    forward, backward = _directions()
    sends, intervals, total = [], [], None
    for phase, i in stage_order(rank, stages, m, schedule):
        # a message is kept until its send is done, and no longer: 1F1B's saving in activations rests on it
        sends = [(handle, message) for handle, message in sends if not handle.is_completed()]
        if phase == "F":
            if first:
                x = X[i * size:(i + 1) * size].to(device)
            else:
                x = torch.empty(size, inputs, device=device)
                dist.recv(x, src=rank - 1, group=forward)
                x.requires_grad_()
            start = _now(device)
            y = module(x)
            if last:
                y = F.cross_entropy(y, labels[i * size:(i + 1) * size].to(device)) / m
                total = y.detach() if total is None else total + y.detach()
            intervals.append({"phase": "forward", "micro_batch": i, "start": start, "end": _now(device)})
            if not last:
                message = y.detach().float()  # float32 on the wire, whatever autocast computed in
                # the message is kept alive until the send is done
                sends.append((dist.isend(message, dst=rank + 1, group=forward), message))
            saved[i] = (x, y)
        else:
            x, y = saved.pop(i)
            grad = None
            if not last:
                grad = torch.empty(size, outputs, device=device)
                dist.recv(grad, src=rank + 1, group=backward)
            start = _now(device)
            y.backward(None if grad is None else grad.to(y.dtype))
            intervals.append({"phase": "backward", "micro_batch": i, "start": start, "end": _now(device)})
            if not first:
                sends.append((dist.isend(x.grad, dst=rank - 1, group=backward), x.grad))
    for handle, _ in sends:
        handle.wait()
    return total, intervals


def _now(device: torch.device) -> float:
    """The time once everything queued on ``device`` has run (a GPU computes asynchronously)."""
    timing.synchronize(device)
    return time.perf_counter()
