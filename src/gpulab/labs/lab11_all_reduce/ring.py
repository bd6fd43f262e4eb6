"""A ring all-reduce from point-to-point calls, and how the grader watches one: the reference ring, a student's
function loaded by name in each worker, collectives switched off and sends counted while it runs, the probe
vectors whose sums tell the mistakes apart, and the bytes a bandwidth-optimal ring sends.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from gpulab.ch16_distributed_training import distributed
from gpulab.core.validation import positive_int

COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "reduce", "broadcast", "all_to_all", "all_to_all_single", "gather", "scatter")
SENDS = ("send", "isend")  # counted; their receiving twins pass through
POINT_TO_POINT = ("send", "isend", "recv", "irecv")


def load_function(target: str) -> Callable:
    """The function ``target`` names: ``path/to/file.py:name`` (loaded from that file) or ``module:name``."""
    where, _, name = target.rpartition(":")
    if not where or not name:
        raise ValueError(f"target: 'file.py:function' or 'module:function', got {target!r}")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"student_{Path(where).stem}", where)
        if spec is None or spec.loader is None:
            raise ValueError(f"target: cannot load {where}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"target: {where} defines no function {name!r}")
    return function


def reference_ring_all_reduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` over every process of the default group, in place: a ring of isend/irecv pairs.

    The chunks are ``torch.tensor_split`` views, so adding into a chunk (reduce-scatter) and copying into
    one (all-gather) writes the tensor itself. Starting the send and the receive of a step together
    (isend, irecv, then wait for both) is what keeps a ring from deadlocking.
    """
    p, rank = dist.get_world_size(), dist.get_rank()
    right, left = (rank + 1) % p, (rank - 1) % p
    chunks = torch.tensor_split(tensor, p)

    def pass_along(send: int, receive: int) -> torch.Tensor:
        """Send chunk ``send`` right while receiving the left neighbour's chunk ``receive``; return what came."""
        incoming = torch.empty_like(chunks[receive])
        for request in [dist.isend(chunks[send], right), dist.irecv(incoming, left)]:  # both started, then waited
            request.wait()
        return incoming

    for step in range(p - 1):
        send, receive = distributed.reduce_scatter_chunks(rank, step, p)
        chunks[receive].add_(pass_along(send, receive))
    for step in range(p - 1):
        send, receive = distributed.all_gather_chunks(rank, step, p)
        chunks[receive].copy_(pass_along(send, receive))


REFERENCE = f"{__name__}:reference_ring_all_reduce"


class CollectiveUsed(RuntimeError):
    """The student's ring called a collective, which the grader switches off while it runs."""


@contextlib.contextmanager
def point_to_point_only() -> Iterator[dict]:
    """Within the block, ``torch.distributed``'s collectives raise :class:`CollectiveUsed` and its sends are
    counted: the yielded dict's ``sent_bytes`` grows by each sent tensor's bytes."""
    modules = (dist, dist.distributed_c10d)  # batch_isend_irecv looks its functions up in the second
    traffic = {"sent_bytes": 0, "messages": 0}
    saved = {(module, name): getattr(module, name) for module in modules for name in COLLECTIVES + POINT_TO_POINT
             if hasattr(module, name)}

    def blocked(name: str) -> Callable:
        def collective(*args, **kwargs):
            raise CollectiveUsed(f"dist.{name} was called: ring_all_reduce must use point-to-point calls only")
        return collective

    depth = [0]  # dist.send calls isend inside: count the outermost call only

    def counted(original: Callable) -> Callable:
        def send(tensor, *args, **kwargs):
            if depth[0] == 0:
                traffic["sent_bytes"] += tensor.numel() * tensor.element_size()
                traffic["messages"] += 1
            depth[0] += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                depth[0] -= 1
        send.__name__ = original.__name__  # P2POp's repr reads it
        return send

    replacements = {name: blocked(name) for name in COLLECTIVES}
    replacements.update({name: counted(saved[(dist.distributed_c10d, name)]) for name in SENDS})
    try:
        for (module, name) in saved:
            if name in replacements:
                setattr(module, name, replacements[name])
        yield traffic
    finally:
        for (module, name), original in saved.items():
            setattr(module, name, original)


def probe_vector(elements: int, rank: int, workers: int) -> torch.Tensor:
    """Worker ``rank``'s probe: (workers + 1)^rank in every element (exact in float32 for up to 8 workers)."""
    return torch.full((elements,), float((workers + 1) ** rank), dtype=torch.float32)


def exercise_cases(workers: int) -> list[int]:
    """Vector lengths the ring is graded on, in order: even, uneven, larger and uneven, shorter than ``workers``."""
    p = positive_int("workers", workers)
    return [4 * p, 4 * p + 1, 1000 * p + p - 1, p - 1] if p > 1 else [4]


def ring_sent_bytes(elements: int, workers: int, rank: int, itemsize: int = 4) -> int:
    """The bytes worker ``rank`` of a ring all-reduce sends: every chunk but (r + 1) mod p in reduce-scatter,
    every chunk but (r + 2) mod p in all-gather: 2 (p - 1) / p of the vector when p divides it."""
    bounds = distributed.chunk_bounds(elements, workers)
    size = [stop - start for start, stop in bounds]
    return itemsize * (2 * elements - size[(rank + 1) % workers] - size[(rank + 2) % workers])
