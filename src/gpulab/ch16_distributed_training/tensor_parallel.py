"""Tensor (model) parallelism of the chapter's MLP, Megatron-style: every weight matrix cut into p slices.

Data parallelism copies the whole model onto every worker. When one layer's weights no longer fit, or
one GPU computes a layer too slowly, the layer itself can be cut {shoeybi2019megatron}. A linear layer
``Y = X W^T + b`` (PyTorch stores ``W`` as outputs x inputs) can be cut two ways:

- **column-parallel** (cut the outputs): worker r holds the rows ``W_r`` of ``W`` for its slice of the
  outputs and computes ``Y_r = X W_r^T + b_r``. Every worker needs the whole input ``X``, and each ends
  with a *slice* of the output's features. Nothing is sent in the forward pass.
- **row-parallel** (cut the inputs): worker r holds the columns ``W_r`` of ``W`` for its slice of the
  inputs, and computes a *partial sum* ``X_r W_r^T`` over its inputs only; the full output is the sum
  over workers: an **all-reduce**.

Megatron's trick is to chain them: a column-parallel layer leaves its output split by features, which is
exactly the input a row-parallel layer wants, and the activation in between (ReLU) acts on each feature
alone, so it runs on the slices without any communication. A *block* (column, ReLU, row) therefore
communicates twice per training step:

- forward, ``g``: the all-reduce of the row layer's partial sums (:class:`ReduceFromParallel`);
- backward, ``f``: the all-reduce of the column layer's input gradient. Each worker's slice of the
  outputs contributes a part ``dY_r W_r`` of ``dX``, and ``dX`` is their sum (:class:`CopyToParallel`,
  the identity going forward).

Both are autograd Functions: ``f`` and ``g`` are each other's transpose (copy one way, sum the other),
which is all the chain rule asks. If nothing needs the gradient of the block's input (the model's first
block, whose input is the data), autograd never calls ``f``'s backward, and that all-reduce is skipped.

:func:`shard_mlp` turns the chapter's ``torch.nn.Sequential`` MLP (:func:`gpulab.ch04_mlp_gemms.mlp.torch_mlp`)
into this rank's slices, pairing its linear layers into blocks; an odd last layer stays whole on every
rank (replicated). :func:`gathered_gradients` reassembles the full gradients for comparison with one
process's, and :func:`traffic` predicts the all-reduces of a step.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpulab.ch16_distributed_training.distributed import ring_factor
from gpulab.core.validation import positive_int, positive_ints


class CopyToParallel(torch.autograd.Function):
    """Megatron's ``f``: the identity forward; backward, the all-reduce (sum) of the input's gradient.

    Each rank's slice of a column-parallel layer contributes one part of the gradient of the layer's
    (shared) input; their sum is the whole gradient. ``log``, if a list, gets one entry per all-reduce.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, log: list | None) -> torch.Tensor:
        ctx.log = log
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.log, "backward"), None


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's ``g``: forward, the all-reduce (sum) of the row-parallel partial sums; backward, the identity.

    The output's gradient is the same on every rank already (everything after the block is replicated),
    and each partial sum entered the total with weight one, so each rank passes it on unchanged.
    """

    @staticmethod
    def forward(ctx, partial: torch.Tensor, log: list | None) -> torch.Tensor:
        return _all_reduce(partial, log, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _all_reduce(tensor: torch.Tensor, log: list | None, phase: str) -> torch.Tensor:
    total = tensor.contiguous().clone()  # a new tensor: autograd must not see its input changed in place
    dist.all_reduce(total)
    if log is not None:
        log.append({"phase": phase, "shape": list(total.shape), "bytes": total.numel() * total.element_size()})
    return total


class ColumnParallelLinear(torch.nn.Module):
    """This rank's slice of the outputs of ``full``: ``Y_r = X W_r^T + b_r``; the output stays split."""

    def __init__(self, full: torch.nn.Linear, rank: int, world: int, log: list | None = None) -> None:
        super().__init__()
        rows = _slice(full.out_features, rank, world, "outputs")
        self.weight = torch.nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = torch.nn.Parameter(full.bias.detach()[rows].clone())
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(CopyToParallel.apply(x, self.log), self.weight, self.bias)


class RowParallelLinear(torch.nn.Module):
    """This rank's slice of the inputs of ``full``: the partial sums ``X_r W_r^T``, all-reduced, plus the bias.

    The bias is added once, after the sum, so every rank holds all of it (and computes the same gradient). It is
    added in the sum's dtype, as ``F.linear`` adds its bias under autocast: a float32 bias added to a bfloat16 sum
    would promote the layer's output, and with it the gradient the next column-parallel layer all-reduces in its
    backward, to float32 (twice the bytes).
    """

    def __init__(self, full: torch.nn.Linear, rank: int, world: int, log: list | None = None) -> None:
        super().__init__()
        columns = _slice(full.in_features, rank, world, "inputs")
        self.weight = torch.nn.Parameter(full.weight.detach()[:, columns].clone())
        self.bias = torch.nn.Parameter(full.bias.detach().clone())
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = ReduceFromParallel.apply(F.linear(x, self.weight), self.log)
        return total + self.bias.to(total.dtype)


def _slice(width: int, rank: int, world: int, what: str) -> slice:
    if width % world:
        raise ValueError(f"world size: {world} ranks cannot split a layer's {width} {what} into equal slices; "
                         "tensor parallelism needs the hidden widths to be multiples of the number of ranks")
    share = width // world
    return slice(rank * share, (rank + 1) * share)


def linear_indices(model: torch.nn.Sequential) -> list[int]:
    """The positions of the linear layers in ``model`` (an MLP as :func:`~gpulab.ch04_mlp_gemms.mlp.torch_mlp`
    builds it); raises ValueError if it has none or holds anything but Linear and ReLU layers."""
    if not all(isinstance(m, torch.nn.Linear | torch.nn.ReLU) for m in model):
        raise ValueError("model: an MLP of torch.nn.Linear and torch.nn.ReLU layers, got "
                         + ", ".join(type(m).__name__ for m in model))
    found = [i for i, m in enumerate(model) if isinstance(m, torch.nn.Linear)]
    if not found:
        raise ValueError("model: has no linear layer")
    return found


def check_widths(sizes: Sequence[int], world: int) -> None:
    """Raise ValueError unless ``world`` ranks can split every block of the MLP ``sizes``: the output width of
    each column-parallel layer (= the input width of the row-parallel layer after it) must be a multiple."""
    sizes, world = positive_ints("sizes", sizes), positive_int("world", world)
    for first in range(0, len(sizes) - 2, 2):  # layer `first` is column-parallel, layer first + 1 row-parallel
        if sizes[first + 1] % world:
            raise ValueError(f"sizes: the hidden width {sizes[first + 1]} (outputs of linear layer {first}) does not "
                             f"split into {world} equal slices, one per rank; tensor parallelism needs a multiple")


def shard_mlp(model: torch.nn.Sequential, rank: int, world: int, log: list | None = None) -> torch.nn.Sequential:
    """This rank's share of ``model`` under tensor parallelism; the parameters keep the names they had in ``model``.

    Linear layers 0 and 1 form a block (column- then row-parallel), 2 and 3 the next, and so on; an odd
    last linear layer is kept whole (every rank computes it, on the same input). ``model`` is left as it was.
    ``log`` (a list) collects one entry per all-reduce the step runs.
    """
    linears = linear_indices(model)
    parts: list[torch.nn.Module] = []
    for position, module in enumerate(model):
        if position not in linears:
            parts.append(torch.nn.ReLU())
            continue
        k = linears.index(position)
        if k % 2 == 0 and k + 1 < len(linears):
            parts.append(ColumnParallelLinear(module, rank, world, log))
        elif k % 2 == 1:
            parts.append(RowParallelLinear(module, rank, world, log))
        else:
            parts.append(copy.deepcopy(module))
    return torch.nn.Sequential(*parts)


def gathered_gradients(sharded: torch.nn.Sequential) -> dict[str, torch.Tensor]:
    """Every rank's gradient slices put back together (a collective: every rank must call it), by parameter name.

    Column-parallel slices are stacked along the outputs (dim 0), row-parallel weights along the inputs
    (dim 1); row-parallel biases and whole layers are the same on every rank and are taken as they are.
    """
    world = dist.get_world_size()
    gradients = {}
    for index, module in enumerate(sharded):
        for name, parameter in module.named_parameters():
            grad = parameter.grad.detach()
            dim = 0 if isinstance(module, ColumnParallelLinear) else (
                1 if isinstance(module, RowParallelLinear) and name == "weight" else None)
            if dim is not None:
                pieces = [torch.empty_like(grad) for _ in range(world)]
                dist.all_gather(pieces, grad.contiguous())
                grad = torch.cat(pieces, dim=dim)
            gradients[f"{index}.{name}"] = grad.cpu()
    return gradients


def traffic(sizes: Sequence[int], batch: int, world: int, itemsize: int = 4, input_gradient: bool = False) -> dict:
    """The all-reduces of one training step of the MLP ``sizes`` under tensor parallelism on ``world`` ranks.

    Per block: forward, the row layer's output (batch x its outputs); backward, the column layer's input
    gradient (batch x its inputs) -- except for the first block when ``input_gradient`` is False (nobody
    needs the gradient of the data). ``sent_bytes`` is what each rank sends in ring all-reduces:
    2 (p - 1) / p times the sum of the messages. The weights (all the traffic of data parallelism) never move.
    """
    sizes, batch = positive_ints("sizes", sizes), positive_int("batch", batch)
    check_widths(sizes, world)
    messages = []
    for first in range(0, len(sizes) - 2, 2):
        messages.append(("forward", batch * sizes[first + 2] * itemsize))
        if first or input_gradient:
            messages.append(("backward", batch * sizes[first] * itemsize))
    total = sum(nbytes for _, nbytes in messages)
    return {"allreduces": len(messages), "forward": sum(p == "forward" for p, _ in messages),
            "backward": sum(p == "backward" for p, _ in messages), "message_bytes": total,
            "sent_bytes": ring_factor(world) * total}
