"""Fully sharded data parallelism (FSDP): data parallelism without a full copy of the model on every rank.

Under DDP every rank holds all P parameters, all P gradients and the optimizer's whole state (Adam: two
more numbers per parameter), although after the all-reduce every rank holds the same values: p copies of
the same 4 P numbers. ZeRO {rajbhandari2020zero} and PyTorch's FSDP {zhao2023pytorch} keep one copy, cut
into p shards: each rank stores 1/p of every parameter tensor, of its gradient and of its optimizer state,
and updates only its shard. The full weights exist only briefly, layer by layer:

- forward: before a layer runs, an **all-gather** assembles its full weights from the p shards; after, the
  full copy is freed (``reshard_after_forward``);
- backward: the layer's weights are all-gathered again, its full weight gradient computed, and a
  **reduce-scatter** sums the ranks' gradients and leaves each rank only its shard of the sum;
- step: each rank's optimizer updates its own shard.

An all-gather and a reduce-scatter each make a rank send (p - 1)/p of the vector: the two halves of a ring
all-reduce. So FSDP sends 3 (p - 1)/p P numbers a step per rank against DDP's 2 (p - 1)/p P
(:func:`communication_bytes`), 1.5 times as much, for state memory divided by p (:func:`predicted_state_bytes`).

Here the sharding is PyTorch's own, FSDP2's ``torch.distributed.fsdp.fully_shard``, which cuts each
parameter along its first dimension (``torch.chunk``: ceil(n / p) rows per rank, the last ranks possibly
fewer) and holds it as a ``DTensor``. It runs on CPU processes with gloo as on GPUs with NCCL, so the
same code is checked in CI and measured on GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from gpulab.ch16_distributed_training.distributed import ring_factor
from gpulab.core.validation import positive_int, positive_ints

STRATEGIES = ("ddp", "fsdp")
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}  # numbers of optimizer state per parameter


def shard(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` under FSDP2 on all the ranks of the process group: each Linear layer its own unit, then the root.

    Sharding each layer separately lets FSDP gather one layer's weights at a time (and free them after),
    instead of the whole model at once. ``model`` is changed in place (its parameters become DTensor shards)
    and returned.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model.modules():
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: its shard if it is a DTensor (FSDP's parameters), else all of it."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def gathered_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient, by name, gathered from the shards (a collective: every rank calls it)."""
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().cpu()
            for name, p in model.named_parameters()}


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """The bytes this rank stores for the parameters, their gradients and the optimizer's state (its tensors
    of the parameters' shape, such as Adam's two moments; not its step counters)."""
    parameters = list(model.parameters())

    def size(tensor: torch.Tensor | None) -> int:
        part = None if tensor is None else local(tensor)
        return 0 if part is None else part.numel() * part.element_size()

    slots = [value for p in parameters for value in (optimizer.state.get(p, {}).values() if optimizer else ())
             if isinstance(value, torch.Tensor) and value.shape == p.shape]
    return {"parameter_bytes": sum(size(p) for p in parameters),
            "gradient_bytes": sum(size(p.grad) for p in parameters), "optimizer_bytes": sum(size(s) for s in slots)}


def predicted_state_bytes(sizes: Sequence[int], world: int, strategy: str = "fsdp", optimizer: str = "adam",
                          itemsize: int = 4) -> dict[str, int]:
    """What the most loaded rank stores for the MLP ``sizes`` (parameters, gradients, optimizer state, bytes).

    DDP: everything, on every rank. FSDP: rank 0's shard of each tensor, ceil(rows / p) of its rows. The
    shards add up to exactly one copy; rank 0's exceeds a p-th only by the rounding up ("padding").
    """
    sizes, p = positive_ints("sizes", sizes), positive_int("world", world)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer: one of {', '.join(OPTIMIZER_SLOTS)}, got {optimizer!r}")
    rows = (lambda n: n) if strategy == "ddp" else (lambda n: math.ceil(n / p))
    numbers = sum(rows(n_out) * (n_in + 1) for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=False))  # W and b
    return {"parameter_bytes": numbers * itemsize, "gradient_bytes": numbers * itemsize,
            "optimizer_bytes": OPTIMIZER_SLOTS[optimizer] * numbers * itemsize}


def communication_bytes(parameters: int, world: int, strategy: str = "fsdp", itemsize: int = 4) -> float:
    """Bytes each rank sends per training step to keep ``parameters`` in step (ring algorithms).

    DDP: an all-reduce of the gradients, 2 (p - 1)/p P b. FSDP: an all-gather of the weights in the forward
    pass, another in the backward pass, and a reduce-scatter of the gradients, each (p - 1)/p P b.
    """
    parameters, p = positive_int("parameters", parameters), positive_int("world", world)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: one of {', '.join(STRATEGIES)}, got {strategy!r}")
    rounds = 2 if strategy == "ddp" else 3
    return rounds / 2 * ring_factor(p) * parameters * itemsize


def activation_bytes(sizes: Sequence[int], batch: int, itemsize: int = 4) -> int:
    """An estimate of the activations one rank keeps for the backward pass of the MLP ``sizes`` on ``batch`` samples:
    each linear layer's input, each ReLU's output and the logits, ``itemsize`` bytes per number. The same under
    DDP and FSDP: both run the whole model on the rank's share of the batch."""
    sizes, batch = positive_ints("sizes", sizes), positive_int("batch", batch)
    return batch * itemsize * (sum(sizes[:-1]) + sum(sizes[1:-1]) + sizes[-1])
