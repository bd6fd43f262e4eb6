"""Data-parallel training on real processes: torchrun started from a notebook, and what the processes measure.

``torch.distributed`` runs one process per worker (per GPU), and ``torchrun`` (``python -m
torch.distributed.run``) starts them, telling each its ``RANK``, ``WORLD_SIZE`` and where to meet
(``MASTER_ADDR``, ``MASTER_PORT``). A notebook cannot be one of those processes, so :func:`launch` starts
torchrun in a subprocess, robustly: a free port (bound to port 0, then handed over), one thread per
worker (``OMP_NUM_THREADS=1``), ``gpulab``'s folder on the workers' ``PYTHONPATH`` whether or not it is
installed, a time limit after which the whole process group is killed, and the workers' own error
messages in the exception when they fail.

The workers run this module: ``python -m gpulab.ch16_distributed_training.ddp TASK ...`` (:func:`main`). Each task
writes its rows, or its error, to a file per rank, which :func:`run_task` collects. The tasks:

- ``gradients``: one step of DistributedDataParallel (DDP) {li2020pytorch} on each rank's share of a batch;
  rank 0 saves the gradients DDP averaged, for the notebook to compare with one process's gradients
  of the whole batch (:func:`ddp_gradients`, :func:`gradient_problem`);
- ``allreduce``: the time of ``dist.all_reduce`` against the message size, checked on fresh random data
  first; the rows give nccl-tests' algorithm and bus bandwidths {nvidia2024nccltests}
  (:func:`allreduce_bandwidth`);
- ``scaling``: the time of a training step of an MLP on one GPU alone and under DDP on all of them
  (:func:`ddp_scaling`): weak scaling, the same batch per GPU, optionally accumulated over micro-batches.

The experiment functions live here, beside the worker code, so that a recording's code hash (of this
module's source) changes whenever the code that measured it does.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch16_distributed_training import distributed
from gpulab.ch16_distributed_training.launch import BACKENDS, TIMEOUT_S, LaunchError, check_gpus, launch
from gpulab.core import env, timing
from gpulab.core.precision import matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.validation import dtype_name, positive_int, positive_ints, supported_dtype

COLLECTIVE_TIMEOUT_S = 120.0  # the process group's limit on one collective: a hang becomes an error
SCALING_PRECISIONS = ("float32", "tf32", "bfloat16")  # float16 would need a GradScaler; bfloat16 needs none


def run_task(task: str, params: Mapping, processes: int, backend: str = "gloo", *, timeout_s: float = TIMEOUT_S,
             collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, output: Path | None = None) -> list[dict]:
    """Run one of this module's tasks on ``processes`` ranks; return each rank's result (rank 0 first).

    A result is a dict with the rank's ``rows``. If a rank reported an error, :class:`LaunchError`
    carries its traceback; ``output`` (a folder) keeps the files a task writes besides its rows.
    """
    if task not in TASKS:
        raise ValueError(f"task: one of {', '.join(TASKS)}, got {task!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: one of {', '.join(BACKENDS)}, got {backend!r}")
    processes = positive_int("processes", processes)
    if backend == "nccl" and torch.cuda.device_count() < processes:
        raise ValueError(f"processes: nccl runs one process per GPU; {processes} asked for, "
                         f"{torch.cuda.device_count()} GPU(s) here")
    with tempfile.TemporaryDirectory(prefix="gpulab_ddp_") as scratch:
        folder = Path(output or scratch)
        arguments = ["-m", "gpulab.ch16_distributed_training.ddp", task, "--backend", backend, "--out", str(folder),
                     "--params", json.dumps(dict(params)), "--collective-timeout", str(collective_timeout_s)]
        failure: LaunchError | None = None
        try:
            launch(arguments, processes, timeout_s=timeout_s)
        except LaunchError as error:
            failure = error
        reports = [json.loads(path.read_text()) for path in sorted(folder.glob("rank*.json"))]
    errors = [r for r in reports if "error" in r]
    if errors or failure is not None:
        first = errors[0] if errors else None
        same = [r["rank"] for r in errors[1:] if r["error"] == first["error"]] if first else []
        detail = (f"rank {first['rank']}" + (f" (and the same on rank {', '.join(map(str, same))})" if same else "")
                  + f": {first['error']}" if first else str(failure))
        raise LaunchError(f"task {task!r} on {processes} {backend} processes failed:\n{detail}",
                          getattr(failure, "returncode", 1), getattr(failure, "stderr", ""),
                          getattr(failure, "timed_out", False))
    if len(reports) != processes:
        raise LaunchError(f"task {task!r}: {len(reports)} of {processes} ranks reported", 0, "")
    return sorted(reports, key=lambda r: r["rank"])






def _initialise(backend: str, collective_timeout_s: float) -> torch.device:
    """Join the process group that torchrun's variables describe; the device this rank computes on."""
    timeout = datetime.timedelta(seconds=collective_timeout_s)
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        return device
    dist.init_process_group("gloo", timeout=timeout)
    return torch.device("cpu")


def _barrier(device: torch.device) -> None:
    dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()


def _max_over_ranks(value: float, device: torch.device) -> float:
    """The largest of every rank's ``value``: a collective's time is that of its slowest rank."""
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.item()


def _nccl_version() -> str | None:
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def gpu_link(first: int = 0, second: int = 1) -> str | None:
    """How GPUs ``first`` and ``second`` are connected, as ``nvidia-smi topo -m`` says ('NV18': 18 NVLinks;
    'PIX', 'PHB', 'SYS': PCIe paths), or None where nvidia-smi cannot tell."""
    try:
        report = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    plain = re.sub(r"\x1b\[[0-9;]*m", "", report.stdout)  # nvidia-smi underlines the header with terminal codes
    lines = [line.split() for line in plain.splitlines() if line.strip()]
    if len(lines) < 2:
        return None
    columns = [token for token in lines[0] if token.startswith("GPU")]  # the header: GPU0 GPU1 ... CPU Affinity
    row = next((line for line in lines[1:] if line[0] == f"GPU{first}"), None)
    name = f"GPU{second}"
    if row is None or name not in columns or len(row) <= columns.index(name) + 1:
        return None
    return row[columns.index(name) + 1]


def gradient_problem(sizes: Sequence[int], batch: int, seed: int = 0
                     ) -> tuple[torch.nn.Sequential, torch.Tensor, torch.Tensor]:
    """The MLP ``mlp.torch_mlp(sizes, seed)``, and a batch of ``batch`` random inputs and class labels.

    Every process that calls it with the same arguments gets the same model and data; the caller's
    random generator is left as it was.
    """
    sizes = positive_ints("sizes", sizes)
    with torch.random.fork_rng(devices=[]):
        model = mlp.torch_mlp(sizes, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    X = torch.randn(positive_int("batch", batch), sizes[0], generator=generator)
    labels = torch.randint(0, sizes[-1], (batch,), generator=generator)
    return model, X, labels


def _gradients_task(device: torch.device, folder: Path, sizes: Sequence[int], batch: int, seed: int) -> list[dict]:
    """One DDP step on this rank's equal share of the batch; rank 0 saves the averaged gradients."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    if batch % world:
        raise ValueError(f"batch: {batch} does not split into {world} equal shares; DDP averages the ranks' "
                         "gradients, which equals the whole batch's gradient only if every share is the same size")
    model, X, labels = gradient_problem(sizes, batch, seed)
    share = slice(rank * batch // world, (rank + 1) * batch // world)
    ddp_model = DDP(model.to(device))  # broadcasts rank 0's weights: every rank starts from the same model
    loss = F.cross_entropy(ddp_model(X[share].to(device)), labels[share].to(device))  # the mean over the share
    loss.backward()  # DDP all-reduces each bucket of gradients as backward produces it, and divides by world
    if rank == 0:
        torch.save({name: p.grad.detach().cpu() for name, p in model.named_parameters()}, folder / "gradients.pt")
    return [{"rank": rank, "share": [share.start, share.stop], "loss": loss.item()}]


def _repeats(nbytes: int, budget_bytes: int, least: int, most: int) -> int:
    """Timed all-reduces per message size: about ``budget_bytes`` in all, between ``least`` and ``most``.

    Every rank must call the collective the same number of times, so the count depends on the size alone.
    """
    return max(least, min(most, budget_bytes // max(nbytes, 1)))


def _fresh(elements: int, seed: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Standard-normal values drawn on ``device`` from ``seed``: the same on every rank that asks."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(elements, generator=generator, device=device, dtype=torch.float32).to(dtype)


def _allreduce_task(device: torch.device, folder: Path, sizes: Sequence[int], dtype: str, warmup: int,
                    budget_bytes: int, least: int, most: int, seed: int) -> list[dict]:
    """The median time of ``dist.all_reduce`` for each message size, after checking its sums."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch_dtype = getattr(torch, dtype_name(dtype))
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    warm = torch.ones(1024, dtype=torch_dtype, device=device)
    dist.all_reduce(warm)  # the first collective sets up the connections; not timed
    rows = []
    for nbytes in sizes:
        elements = max(1, nbytes // itemsize)
        # Correctness first, on fresh random data: every rank regenerates everyone's vector for the sum.
        result = _fresh(elements, seed * 7919 + rank, device, torch_dtype)
        dist.all_reduce(result)
        expected = sum(_fresh(elements, seed * 7919 + owner, device, torch_dtype).double() for owner in range(world))
        error = (torch.linalg.vector_norm(result.double() - expected) / torch.linalg.vector_norm(expected)).item()
        del expected
        if not error <= 1e-6 * world:
            raise AssertionError(f"all_reduce of {elements} elements: relative error {error:.3g} of the sum")
        # Then the time. The values grow by a factor of world per call and may reach inf after many calls:
        # that changes no timing (inf + inf is added as fast as any sum) and nobody reads them.
        buffer = torch.ones(elements, dtype=torch_dtype, device=device)
        repeats = _repeats(elements * itemsize, budget_bytes, least, most)
        _barrier(device)
        measured = timing.measure(lambda buffer=buffer: dist.all_reduce(buffer), device=device, warmup=warmup,
                                  repeats=repeats, flush_l2=False)
        seconds = _max_over_ranks(measured.median_s, device)
        spread = _max_over_ranks(measured.spread, device)
        size = elements * itemsize
        rows.append({"bytes": size, "elements": elements, "dtype": dtype_name(dtype), "seconds": seconds,
                     "spread": spread, "repeats": repeats, "max_error": error,
                     "algbw_gbs": distributed.algorithm_bandwidth(size, seconds) / 1e9,
                     "busbw_gbs": distributed.bus_bandwidth(size, seconds, world) / 1e9})
        del buffer, result
    return rows


def _training_step(model: torch.nn.Module, micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], precision: str,
                   learning_rate: float) -> Callable[[], torch.Tensor]:
    """A plain SGD training step of ``model`` in ``precision`` (bfloat16: autocast) over ``micro_batches``.

    Each (inputs, labels) pair is one forward and backward pass, and their gradients add up (each loss
    is divided by their number, so the sum is the mean over all of them) before one optimizer step:
    gradient accumulation. Under DDP every micro-batch but the last runs inside ``model.no_sync()``, so
    the accumulated gradients are all-reduced once, during the last backward pass.
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    autocast = precision == "bfloat16"
    last = len(micro_batches) - 1

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        for i, (X, labels) in enumerate(micro_batches):
            quiet = model.no_sync() if i < last and hasattr(model, "no_sync") else contextlib.nullcontext()
            with quiet:  # the backward pass must run inside no_sync too: that is where DDP would all-reduce
                with torch.autocast(X.device.type, dtype=torch.bfloat16, enabled=autocast):
                    loss = F.cross_entropy(model(X), labels) / len(micro_batches)
                loss.backward()  # under DDP and outside no_sync, the gradients are all-reduced here, bucket by bucket
        optimizer.step()
        return loss.detach()

    return step


def _scaling_task(device: torch.device, folder: Path, sizes: Sequence[int], batches: Sequence[int],
                  precisions: Sequence[str], micro_batches: Sequence[int], warmup: int, repeats: int,
                  learning_rate: float, seed: int) -> list[dict]:
    """For each precision, per-rank batch and number of micro-batches: a step's time on one device alone,
    then under DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    parameters = distributed.parameter_count(sizes)
    link = gpu_link() if device.type == "cuda" and rank == 0 else None
    rows = []
    for precision, batch, count in itertools.product(precisions, batches, micro_batches):
        name = supported_dtype("precisions", precision, device)
        if name not in SCALING_PRECISIONS:
            raise ValueError(f"precisions: one of {', '.join(SCALING_PRECISIONS)}, got {name!r}")
        generator = torch.Generator().manual_seed(seed + 1 + rank)  # each rank its own share of the data
        data = [(torch.randn(batch, sizes[0], generator=generator).to(device),
                 torch.randint(0, sizes[-1], (batch,), generator=generator).to(device)) for _ in range(count)]
        with matmul_mode("tf32" if name == "tf32" else "float32"):
            # One device alone: every rank at once, each on its own GPU, without talking to the others.
            with torch.random.fork_rng(devices=[]):
                alone = mlp.torch_mlp(sizes, seed=seed).to(device)
            step = _training_step(alone, data, name, learning_rate)
            _barrier(device)
            single = timing.measure(step, device=device, warmup=warmup, repeats=repeats, flush_l2=False)
            del alone, step
            # All of them under DDP: the same model and data per rank, gradients averaged every step.
            with torch.random.fork_rng(devices=[]):
                model = mlp.torch_mlp(sizes, seed=seed).to(device)
            together = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                           gradient_as_bucket_view=True)
            step = _training_step(together, data, name, learning_rate)
            loss = step()
            if not torch.isfinite(loss):
                raise AssertionError(f"{name}, batch {batch}: the loss of a DDP step is {loss.item()}")
            _check_in_step(model)
            _barrier(device)
            ddp = timing.measure(step, device=device, warmup=warmup, repeats=repeats, flush_l2=False)
            del together, model, step
        single_s, ddp_s = _max_over_ranks(single.median_s, device), _max_over_ranks(ddp.median_s, device)
        samples = count * batch  # per device and step
        gemm_flops = count * mlp.step_totals(mlp.training_step_operations(sizes, batch))["gemm"]
        rows.append({"precision": name, "batch_per_device": batch, "micro_batches": count,
                     "samples_per_step": samples, "devices": world, "sizes": list(sizes),
                     "parameters": parameters, "gradient_bytes": parameters * 4,  # float32 in every precision
                     "single_seconds": single_s, "ddp_seconds": ddp_s,
                     "single_spread": single.spread, "ddp_spread": ddp.spread,
                     "single_samples_per_s": samples / single_s, "ddp_samples_per_s": world * samples / ddp_s,
                     "efficiency": single_s / ddp_s, "single_tflops": gemm_flops / single_s / 1e12,
                     "link": link, "status": "ok"})
        del data
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _check_in_step(model: torch.nn.Module) -> None:
    """After a DDP step every rank must hold the same weights: compare each with rank 0's."""
    for name, parameter in model.named_parameters():
        reference = parameter.detach().clone()
        dist.broadcast(reference, src=0)
        gap = (parameter.detach() - reference).abs().max().item()
        scale = reference.abs().max().item() or 1.0
        if not _max_over_ranks(gap, parameter.device) <= 1e-6 * scale:
            raise AssertionError(f"after a DDP step, {name} differs between ranks by {gap:.3g}")


TASKS: dict[str, Callable[..., list[dict]]] = {
    "gradients": _gradients_task, "allreduce": _allreduce_task, "scaling": _scaling_task}


def main(argv: Sequence[str] | None = None) -> int:
    """A worker's entry point (``python -m gpulab.ch16_distributed_training.ddp TASK --out FOLDER ...`` under torchrun).

    Writes ``FOLDER/rank<R>.json``: the task's rows, or the error's traceback.
    """
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--backend", choices=BACKENDS, default="gloo")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", default="{}", help="the task's keyword arguments, as JSON")
    parser.add_argument("--collective-timeout", type=float, default=COLLECTIVE_TIMEOUT_S)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    report: dict = {"rank": rank}
    try:
        device = _initialise(args.backend, args.collective_timeout)
        report["rows"] = TASKS[args.task](device, args.out, **json.loads(args.params))
        report["device"] = env.describe(device).name
        report["nccl_version"] = _nccl_version() if args.backend == "nccl" else None
    except Exception:  # reported to the notebook, which raises it there with this traceback
        report["error"] = traceback.format_exc()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    if "error" in report:
        os._exit(1)  # at once: the other ranks may be stuck in a collective this rank will never join
    dist.destroy_process_group()
    return 0






def ddp_gradients(sizes: Sequence[int], batch: int, processes: int = 2, seed: int = 0, *,
                  timeout_s: float = TIMEOUT_S) -> dict[str, torch.Tensor]:
    """Train one DDP step of :func:`gradient_problem` on ``processes`` gloo processes, each on an equal share of
    the batch; the gradients DDP left on rank 0, by parameter name."""
    if positive_int("batch", batch) % positive_int("processes", processes):
        raise ValueError(f"batch: {batch} does not split into {processes} equal shares; DDP averages the ranks' "
                         "gradients, which equals the whole batch's gradient only if the shares are the same size")
    with tempfile.TemporaryDirectory(prefix="gpulab_ddp_") as folder:
        run_task("gradients", {"sizes": list(sizes), "batch": batch, "seed": seed}, processes, "gloo",
                 timeout_s=timeout_s, output=Path(folder))
        return torch.load(Path(folder) / "gradients.pt")


@experiment("distributed_nccl_allreduce", runs=("main",))
def allreduce_bandwidth(sizes: Sequence[int], processes: int = 2, backend: str = "gloo", dtype: str = "float32", *,
                        warmup: int = 5, budget_bytes: int | None = None, least: int = 5, most: int | None = None,
                        seed: int = 0, timeout_s: float = TIMEOUT_S) -> list[dict]:
    """``dist.all_reduce`` timed on ``processes`` ranks for each message size in ``sizes`` (bytes); one row per size.

    Before timing a size, every rank checks the sum on fresh random data. Each size is then timed about
    ``budget_bytes`` worth (between ``least`` and ``most`` calls, after ``warmup``), CUDA events on a GPU;
    the row's ``seconds`` is the slowest rank's median. ``algbw_gbs`` and ``busbw_gbs`` follow nccl-tests:
    bytes / seconds, and that times 2 (p - 1) / p. gloo runs on CPU tensors; nccl on one GPU per process.
    """
    sizes = positive_ints("sizes", sizes)
    on_gpu = backend == "nccl"
    params = {"sizes": sizes, "dtype": dtype_name(dtype), "warmup": warmup, "seed": seed,
              "budget_bytes": budget_bytes or (4 * 2**30 if on_gpu else 64 * 2**20),
              "least": positive_int("least", least), "most": most or (200 if on_gpu else 50)}
    reports = run_task("allreduce", params, processes, backend, timeout_s=timeout_s)
    first = reports[0]
    return [{**row, "backend": backend, "processes": processes, "device": first["device"],
             "nccl_version": first["nccl_version"], "status": "ok"} for row in first["rows"]]


@experiment("distributed_allreduce_gpus", runs=("main",))
def allreduce_by_gpus(sizes: Sequence[int], processes: Sequence[int] = (2,), backend: str = "gloo", *,
                      timeout_s: float = TIMEOUT_S) -> list[dict]:
    """:func:`allreduce_bandwidth` (float32, its default budget per size) on each number of ``processes``:
    the all-reduce's bus bandwidth curve for every machine size, one row per size and number (``processes``)."""
    check_gpus(backend, processes)
    return [row for count in positive_ints("processes", processes)
            for row in allreduce_bandwidth(sizes, count, backend, timeout_s=timeout_s)]


@experiment("distributed_ddp_scaling", runs=("main",))
def ddp_scaling(sizes: Sequence[int], batches: Sequence[int], precisions: Sequence[str] = ("bfloat16",),
                processes: int = 2, *, micro_batches: Sequence[int] = (1,), warmup: int = 5, repeats: int = 20,
                learning_rate: float = 1e-3, seed: int = 0, timeout_s: float = TIMEOUT_S) -> list[dict]:
    """Weak scaling of a training step of the MLP ``sizes``: one device alone against ``processes`` under DDP.

    For each precision (float32 with TF32 off, tf32, or bfloat16 autocast), batch per device and number of
    micro-batches (a step accumulates the gradients of that many batches, and DDP all-reduces once per
    step), each rank times a step alone, then all ranks time DDP steps together (after checking that a DDP
    step leaves the same weights on every rank). ``efficiency`` = throughput of all / (processes x
    throughput of one) = single_seconds / ddp_seconds. On GPUs (nccl, one per process) when there are
    enough, else on CPU (gloo).
    """
    backend = "nccl" if torch.cuda.device_count() >= processes > 1 else "gloo"
    params = {"sizes": positive_ints("sizes", sizes), "batches": positive_ints("batches", batches),
              "precisions": [dtype_name(p, "precisions") for p in precisions],
              "micro_batches": positive_ints("micro_batches", micro_batches), "warmup": warmup,
              "repeats": positive_int("repeats", repeats), "learning_rate": learning_rate, "seed": seed}
    reports = run_task("scaling", params, processes, backend, timeout_s=timeout_s)
    first = reports[0]
    return [{**row, "backend": backend, "device": first["device"], "nccl_version": first["nccl_version"]}
            for row in first["rows"]]


if __name__ == "__main__":
    sys.exit(main())
