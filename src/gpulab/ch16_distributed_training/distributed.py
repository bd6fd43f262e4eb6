"""Distributed DNN training on paper: what each way of splitting a step sends, and the ring all-reduce.

A training step can be split over ``p`` workers (GPUs) in three ways {lapenna2022unit11}:

- **data parallelism**: every worker holds the whole model and runs a ``1/p`` share of the batch; the
  workers then sum their weight gradients with an *all-reduce*, once per step;
- **tensor (model) parallelism**: every weight matrix is cut into ``p`` slices, one per worker, and the
  workers exchange activations inside every layer pair (Megatron-LM's scheme {shoeybi2019megatron});
- **pipeline parallelism**: the layers are cut into ``p`` consecutive stages, and each stage sends its
  output activations to the next stage and their gradients back {huang2019gpipe}.

:func:`parallelism_traffic` counts the bytes each worker sends per step for an MLP of square layers,
and :func:`.figures.parallelism_figure` draws who computes what.

The all-reduce of data parallelism is the subject of the rest of the module. In a *ring* all-reduce
{patarasuk2009bandwidth,sergeev2018horovod} each worker cuts its vector into ``p`` chunks and talks only to
its two neighbours: ``p - 1`` steps of *reduce-scatter* (each step, send one chunk to the right, add the
chunk received from the left), after which each worker holds one chunk summed over all workers, then
``p - 1`` steps of *all-gather* (pass the summed chunks on around the ring, each overwriting). Every
worker sends ``2 (p - 1) / p`` times the vector's size, which no all-reduce can beat. :func:`simulate`
runs any all-reduce written as rounds of :class:`Message` on NumPy vectors, checks nothing but moves
data, and counts what each worker sent; :func:`ring_rounds`, :func:`tree_rounds` and :func:`naive_rounds`
write the three algorithms the chapter compares, and :func:`allreduce_traffic` runs them and checks that
each leaves every worker with the exact sum. :func:`model_seconds` is the latency-bandwidth model of
their time.

Real processes (``torch.distributed``, DDP, NCCL) are in :mod:`gpulab.ch16_distributed_training.ddp`; the nccl-tests
definitions of algorithm and bus bandwidth are :func:`algorithm_bandwidth` and :func:`bus_bandwidth` here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpulab.core.flops import bytes_per_element
from gpulab.core.validation import positive_int, positive_ints


def parameter_count(sizes: Sequence[int]) -> int:
    """Weights and biases of an MLP with layer widths ``sizes`` (inputs first): sum of (n_in + 1) n_out."""
    sizes = positive_ints("sizes", sizes)
    if len(sizes) < 2:
        raise ValueError(f"sizes: at least an input and an output width, got {sizes}")
    return sum((n_in + 1) * n_out for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=False))


def ring_factor(workers: int) -> float:
    """2 (p - 1) / p: the bytes a ring all-reduce makes each of ``workers`` send, per byte of the vector."""
    p = positive_int("workers", workers)
    return 2 * (p - 1) / p


def parallelism_traffic(width: int, depth: int, batch: int, workers: int, dtype: str = "float32") -> list[dict]:
    """What each worker holds and sends in one training step of an MLP of ``depth`` layers of ``width`` x ``width``.

    One row per strategy, for a global batch of ``batch`` samples on ``workers`` workers, with values in
    ``dtype``: the weights each worker holds (``weight_bytes``), the bytes it sends per step
    (``sent_bytes``; for pipeline parallelism, an inner stage), how many messages that takes, and
    whether the communication can overlap the computation. The counts:

    - data: one all-reduce of the gradients of the P weights, 2 (p - 1)/p x P x b bytes per worker (a ring);
    - tensor: Megatron-style layer pairs (the first cut by columns, the second by rows) need one all-reduce
      of the batch's activations, ``batch`` x ``width``, per pair in the forward pass and one in the
      backward pass: ceil(depth / 2) x 2 all-reduces, each 2 (p - 1)/p x batch x width x b per worker;
    - pipeline: an inner stage sends its output activations (batch x width) forward and the gradient of its
      input (batch x width) backward: 2 x batch x width x b, point to point.
    """
    width, depth, batch, p = (positive_int(name, value) for name, value in
                              (("width", width), ("depth", depth), ("batch", batch), ("workers", workers)))
    if p < 2:
        raise ValueError(f"workers: at least 2 to split anything, got {p}")
    if depth < p:
        raise ValueError(f"depth: pipeline parallelism needs at least one layer per worker: {depth} layers < {p}")
    if batch % p:
        raise ValueError(f"batch: data parallelism splits it evenly over the workers: {batch} is not a multiple of {p}")
    b = bytes_per_element(dtype)
    weights = depth * width * width  # biases are a rounding error here: 1/width of the weights
    activation = batch * width * b
    pairs = math.ceil(depth / 2)
    return [
        {"strategy": "data", "splits": f"the batch: {batch // p} samples per worker",
         "holds": "all the weights", "weight_bytes": weights * b,
         "communicates": "the weight gradients: one all-reduce per step", "messages": 2 * (p - 1),
         "sent_bytes": ring_factor(p) * weights * b, "overlaps": "yes: with the backward pass, layer by layer"},
        {"strategy": "tensor", "splits": f"every weight matrix: 1/{p} of its rows or columns per worker",
         "holds": f"1/{p} of every layer", "weight_bytes": weights * b / p,
         "communicates": f"activations: {2 * pairs} all-reduces of {batch} x {width} per step",
         "messages": 2 * pairs * 2 * (p - 1), "sent_bytes": 2 * pairs * ring_factor(p) * activation,
         "overlaps": "hardly: the next layer needs the result"},
        {"strategy": "pipeline", "splits": f"the layers: about {depth / p:.3g} consecutive layers per worker",
         "holds": f"about 1/{p} of the layers", "weight_bytes": weights * b / p,
         "communicates": f"activations of {batch} x {width} forward, their gradients backward",
         "messages": 2, "sent_bytes": 2 * activation,
         "overlaps": "partly: with micro-batches, while other stages compute"},
    ]


def chunk_bounds(elements: int, workers: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` of each of ``workers`` chunks of a vector of ``elements``: as equal as can be.

    The first ``elements % workers`` chunks are one element longer (the convention of ``np.array_split``
    and ``torch.tensor_split``); with fewer elements than workers, the last chunks are empty.
    """
    n = int(elements)
    if n < 0 or n != elements:
        raise ValueError(f"elements: a whole number >= 0, got {elements!r}")
    p = positive_int("workers", workers)
    base, extra = divmod(n, p)
    stops = np.cumsum([base + (1 if i < extra else 0) for i in range(p)])
    return [(int(stop - (base + (1 if i < extra else 0))), int(stop)) for i, stop in enumerate(stops)]


def reduce_scatter_chunks(rank: int, step: int, workers: int) -> tuple[int, int]:
    """(chunk sent to the right, chunk received from the left and added) by ``rank`` at reduce-scatter ``step``.

    Step 0 sends the worker's own chunk ``rank``; each step then passes on the chunk just received, so the
    chunk a worker adds to at step s is the one it sends at step s + 1. After ``workers - 1`` steps worker
    r holds chunk (r + 1) mod p summed over everyone.
    """
    _check_step(rank, step, workers)
    return (rank - step) % workers, (rank - step - 1) % workers


def all_gather_chunks(rank: int, step: int, workers: int) -> tuple[int, int]:
    """(chunk sent to the right, chunk received from the left, overwriting) by ``rank`` at all-gather ``step``.

    Step 0 sends the summed chunk (r + 1) mod p that reduce-scatter left on worker r; after ``workers - 1``
    steps every worker holds every summed chunk.
    """
    _check_step(rank, step, workers)
    return (rank + 1 - step) % workers, (rank - step) % workers


def _check_step(rank: int, step: int, workers: int) -> None:
    p = positive_int("workers", workers)
    if not 0 <= rank < p:
        raise ValueError(f"rank: between 0 and workers - 1 = {p - 1}, got {rank}")
    if not 0 <= step < p - 1:
        raise ValueError(f"step: between 0 and workers - 2 = {p - 2} (a phase has p - 1 steps), got {step}")


def ring_schedule(workers: int) -> list[dict]:
    """Every step of a ring all-reduce on ``workers`` workers: one row per worker and step, phase by phase."""
    p = positive_int("workers", workers)
    rows = []
    for phase, chunks in (("reduce-scatter", reduce_scatter_chunks), ("all-gather", all_gather_chunks)):
        for step in range(p - 1):
            for rank in range(p):
                sends, receives = chunks(rank, step, p)
                rows.append({"phase": phase, "step": step, "rank": rank, "sends": sends, "to": (rank + 1) % p,
                             "receives": receives, "from": (rank - 1) % p,
                             "then": "adds it to its own" if phase == "reduce-scatter" else "overwrites its own"})
    return rows






@dataclass(frozen=True)
class Message:
    """``source`` sends its elements ``[start, stop)`` to ``target``, which adds them to its own (``add``) or
    overwrites its own with them."""

    source: int
    target: int
    start: int
    stop: int
    add: bool


@dataclass
class Simulation:
    """What an all-reduce did: every worker's final vector, and the bytes each worker sent and received.

    ``rounds`` is the number of rounds; ``critical_bytes`` sums, over the rounds, the largest message of
    each round: the bytes that a link must carry one after the other, whatever the others do.
    ``history`` holds every worker's vector after each round (the start first), if it was asked for.
    """

    results: list[np.ndarray]
    sent_bytes: list[int]
    received_bytes: list[int]
    rounds: int
    critical_bytes: int
    history: list[list[np.ndarray]]


def simulate(vectors: Sequence[np.ndarray], rounds: Sequence[Sequence[Message]], *,
             keep_history: bool = False) -> Simulation:
    """Run ``rounds`` of messages on copies of ``vectors`` (one per worker) and count the traffic.

    Within a round every message carries its source's values as they were when the round began
    (the workers exchange at the same time), and each worker sends at most one message and receives
    at most one: one port in each direction, as on a full-duplex link. Raises ValueError otherwise.
    """
    data = [np.array(v, copy=True) for v in vectors]
    p = len(data)
    if p < 1 or any(v.shape != data[0].shape or v.ndim != 1 for v in data):
        raise ValueError("vectors: one 1-D array per worker, all of the same length")
    itemsize = data[0].itemsize
    sent, received = [0] * p, [0] * p
    critical = 0
    history = [[v.copy() for v in data]] if keep_history else []
    for index, messages in enumerate(rounds):
        sources = [m.source for m in messages]
        targets = [m.target for m in messages]
        if len(set(sources)) < len(sources) or len(set(targets)) < len(targets):
            raise ValueError(f"rounds: in round {index} a worker sends or receives more than one message")
        if any(not (0 <= w < p) for w in sources + targets) or any(m.source == m.target for m in messages):
            raise ValueError(f"rounds: round {index} names a worker outside 0..{p - 1}, or one sending to itself")
        payloads = [data[m.source][m.start:m.stop].copy() for m in messages]
        for message, payload in zip(messages, payloads, strict=True):
            if message.add:
                data[message.target][message.start:message.stop] += payload
            else:
                data[message.target][message.start:message.stop] = payload
            sent[message.source] += payload.size * itemsize
            received[message.target] += payload.size * itemsize
        critical += max((payload.size * itemsize for payload in payloads), default=0)
        if keep_history:
            history.append([v.copy() for v in data])
    return Simulation(data, sent, received, len(rounds), critical, history)


def ring_rounds(elements: int, workers: int) -> list[list[Message]]:
    """The ring all-reduce as rounds: ``workers - 1`` of reduce-scatter, then ``workers - 1`` of all-gather."""
    p = positive_int("workers", workers)
    bounds = chunk_bounds(elements, p)
    rounds = []
    for chunks, add in ((reduce_scatter_chunks, True), (all_gather_chunks, False)):
        for step in range(p - 1):
            rounds.append([Message(r, (r + 1) % p, *bounds[chunks(r, step, p)[0]], add=add) for r in range(p)])
    return rounds


def naive_rounds(elements: int, workers: int) -> list[list[Message]]:
    """Gather everything to worker 0, which adds it up, then send the sum to each worker: 2 (p - 1) rounds."""
    p = positive_int("workers", workers)
    gather = [[Message(w, 0, 0, elements, add=True)] for w in range(1, p)]
    broadcast = [[Message(0, w, 0, elements, add=False)] for w in range(1, p)]
    return gather + broadcast


def tree_rounds(elements: int, workers: int) -> list[list[Message]]:
    """A binomial tree: reduce to worker 0 in ceil(log2 p) rounds (at distance 1, 2, 4, ...), then broadcast
    back down the same tree: 2 ceil(log2 p) rounds, each moving whole vectors."""
    p = positive_int("workers", workers)
    distances = [2**k for k in range(math.ceil(math.log2(p)))] if p > 1 else []
    reduce = [[Message(r, r - d, 0, elements, add=True) for r in range(p) if r % (2 * d) == d] for d in distances]
    broadcast = [[Message(r, r + d, 0, elements, add=False) for r in range(0, p, 2 * d) if r + d < p]
                 for d in reversed(distances)]
    return reduce + broadcast


ALGORITHMS: dict[str, Callable[[int, int], list[list[Message]]]] = {
    "ring": ring_rounds, "tree": tree_rounds, "naive": naive_rounds}


def allreduce_traffic(workers: Sequence[int], elements: int, *, itemsize: int = 4, seed: int = 0) -> list[dict]:
    """Simulate every algorithm of :data:`ALGORITHMS` for each worker count; one row per (algorithm, workers).

    Each run sums fresh random vectors (float32 for ``itemsize`` 4, float64 for 8) and must leave every
    worker with the sum computed directly (AssertionError otherwise). Rows: the rounds, the bytes sent by
    the busiest worker and in all, the critical bytes (see :class:`Simulation`), and the busiest worker's
    bytes over the vector's size.
    """
    dtype = {4: np.float32, 8: np.float64}.get(itemsize)
    if dtype is None:
        raise ValueError(f"itemsize: 4 (float32) or 8 (float64), got {itemsize}")
    elements = positive_int("elements", elements)
    size = elements * itemsize
    generator = np.random.default_rng(seed)
    rows = []
    for p in positive_ints("workers", workers):
        vectors = [generator.standard_normal(elements).astype(dtype) for _ in range(p)]
        expected = np.sum(np.asarray(vectors, dtype=np.float64), axis=0)
        for name, make_rounds in ALGORITHMS.items():
            run = simulate(vectors, make_rounds(elements, p))
            for rank, result in enumerate(run.results):
                error = np.max(np.abs(result - expected)) / np.max(np.abs(expected))
                if not error <= 1e-5 * p:  # float32 sums of p terms in some order; NaN fails
                    raise AssertionError(f"{name} on {p} workers: worker {rank} is off the sum by {error:.3g}")
            rows.append({"algorithm": name, "workers": p, "bytes": size, "rounds": run.rounds,
                         "max_sent_bytes": max(run.sent_bytes), "max_received_bytes": max(run.received_bytes),
                         "total_sent_bytes": sum(run.sent_bytes), "critical_bytes": run.critical_bytes,
                         "sent_over_size": max(run.sent_bytes) / size})
    return rows


def model_seconds(algorithm: str, workers: int, nbytes: float, latency_s: float, bandwidth: float) -> float:
    """The latency-bandwidth model of an all-reduce's time: rounds x ``latency_s`` + critical bytes / ``bandwidth``.

    The closed forms of what :func:`simulate` counts for each algorithm of :data:`ALGORITHMS`
    (``bandwidth`` in bytes per second, one direction of one link):

    - ring: 2 (p - 1) rounds, 2 (p - 1) / p x S critical bytes;
    - tree: 2 ceil(log2 p) rounds, each moving the whole vector;
    - naive: 2 (p - 1) rounds, each moving the whole vector (worker 0 receives, then sends, one at a time).
    """
    p = positive_int("workers", workers)
    if not (latency_s >= 0 and bandwidth > 0 and nbytes >= 0):
        raise ValueError(f"latency_s >= 0, bandwidth > 0 and nbytes >= 0, got {latency_s}, {bandwidth}, {nbytes}")
    if algorithm == "ring":
        rounds, critical = 2 * (p - 1), ring_factor(p) * nbytes
    elif algorithm == "tree":
        rounds = 2 * math.ceil(math.log2(p))
        critical = rounds * nbytes
    elif algorithm == "naive":
        rounds = 2 * (p - 1)
        critical = rounds * nbytes
    else:
        raise ValueError(f"algorithm: one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    return rounds * latency_s + critical / bandwidth


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """algbw = S / t: the vector's bytes over the collective's time, in bytes per second {nvidia2024nccltests}."""
    if not (nbytes >= 0 and seconds > 0):
        raise ValueError(f"nbytes >= 0 and seconds > 0, got {nbytes} and {seconds}")
    return nbytes / seconds


def bus_bandwidth(nbytes: float, seconds: float, workers: int) -> float:
    """busbw = algbw x 2 (p - 1) / p for an all-reduce: the rate at which each link carries data in a ring.

    It is the number to compare with a link's bandwidth, and it does not change with p, where algbw
    falls towards half of it {nvidia2024nccltests}.
    """
    return algorithm_bandwidth(nbytes, seconds) * ring_factor(workers)


# ImageNet / ResNet-50 training time and top-1 (1-crop) validation accuracy, as the course's slides list them
# {lapenna2022unit11}; processors None where the slide gives "full TPU Pod" rather than a count.
LARGE_BATCH_RESULTS: tuple[dict, ...] = (
    {"year": 2016, "who": "He et al.", "key": "he2016resnet", "batch": 256, "batch_end": 256, "processors": 8,
     "processor": "Tesla P100", "library": "Caffe", "seconds": 29 * 3600, "accuracy": 0.753},
    {"year": 2017, "who": "Goyal et al.", "key": "goyal2017accurate", "batch": 8192, "batch_end": 8192,
     "processors": 256, "processor": "Tesla P100", "library": "Caffe2", "seconds": 3600, "accuracy": 0.763},
    {"year": 2017, "who": "Smith et al.", "key": "smith2018dont", "batch": 8192, "batch_end": 16384,
     "processors": None, "processor": "full TPU Pod", "library": "TensorFlow", "seconds": 30 * 60, "accuracy": 0.761},
    {"year": 2017, "who": "Akiba et al.", "key": "akiba2017extremely", "batch": 32768, "batch_end": 32768,
     "processors": 1024, "processor": "Tesla P100", "library": "Chainer", "seconds": 15 * 60, "accuracy": 0.749},
    {"year": 2018, "who": "Jia et al.", "key": "jia2018highly", "batch": 65536, "batch_end": 65536,
     "processors": 2048, "processor": "Tesla P40", "library": "TensorFlow", "seconds": 6.6 * 60, "accuracy": 0.758},
    {"year": 2018, "who": "Mikami et al.", "key": "mikami2018massively", "batch": 34816, "batch_end": 69632,
     "processors": 2176, "processor": "Tesla V100", "library": "NNL", "seconds": 224, "accuracy": 0.7503},
)
BASE_BATCH, BASE_LEARNING_RATE = 256, 0.1  # Goyal et al.'s reference: learning rate 0.1 for a batch of 256


def large_batch_rows(results: Sequence[dict] = LARGE_BATCH_RESULTS) -> list[dict]:
    """The table with what follows from it: minutes, speed-up over the first row, processor-hours, and the
    learning rate that the linear scaling rule gives the (final) batch, 0.1 x batch / 256 {goyal2017accurate}."""
    first = results[0]["seconds"]
    rows = []
    for r in results:
        hours = r["processors"] * r["seconds"] / 3600 if r["processors"] else None
        rows.append({**r, "minutes": r["seconds"] / 60, "speedup": first / r["seconds"], "processor_hours": hours,
                     "linear_rule_lr": BASE_LEARNING_RATE * r["batch_end"] / BASE_BATCH})
    return rows


def describe_result(row: dict) -> str:
    """One line for a row of :data:`LARGE_BATCH_RESULTS`: who, the batch, the machine, the time, the accuracy."""
    batch = f"{row['batch']:,}" + (f" to {row['batch_end']:,}" if row["batch_end"] != row["batch"] else "")
    machine = f"{row['processors']:,} x {row['processor']}" if row["processors"] else row["processor"]
    return (f"{row['who']} {row['year']}: batch {batch} on {machine} ({row['library']}), "
            f"{row['seconds'] / 60:,.3g} minutes, top-1 {row['accuracy']:.2%}")
