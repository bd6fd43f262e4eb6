"""Tensor, pipeline and fully sharded parallelism on real processes: the checks and the measurements.

The workers run this module under torchrun, as :mod:`.ddp`'s run that one:
``python -m gpulab.ch16_distributed_training.parallel TASK --out FOLDER --params JSON`` (:func:`main`), and
:func:`run_task` starts them from a notebook (with :func:`.launch.launch`) and collects each rank's rows.
The tasks:

- ``tensor``, ``pipeline``, ``sharded``: one training step of the chapter's MLP (:func:`.ddp.gradient_problem`)
  under tensor parallelism (:mod:`.tensor_parallel`), pipeline parallelism (:mod:`.pipeline`) or FSDP
  (:mod:`.sharded`); the ranks save the loss and the gradients, for :func:`parallel_gradients` to compare
  with one process's on the whole batch: the same numbers up to rounding, or the code is wrong;
- ``timing``: a training step of one strategy timed against one device alone (:func:`parallel_scaling`,
  :func:`pipeline_bubble`): step time, samples per second, scaling efficiency, peak memory per GPU, the
  bytes each rank stores and sends, and, for a pipeline, the measured bubble.

Data parallelism (DDP, FSDP) is measured in *weak* scaling: each GPU gets the same batch it would train
alone, and efficiency = time alone / time together. Tensor and pipeline parallelism split one model and
one batch: *strong* scaling, efficiency = time alone / (p x time together).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpulab.ch04_mlp_gemms import mlp
from gpulab.ch16_distributed_training import ddp, pipeline, sharded, tensor_parallel
from gpulab.ch16_distributed_training.launch import BACKENDS, TIMEOUT_S, LaunchError, check_gpus, launch
from gpulab.core import env, timing
from gpulab.core.precision import matmul_mode
from gpulab.core.provenance import experiment
from gpulab.core.validation import dtype_name, positive_int, positive_ints

STRATEGIES = ("ddp", "fsdp", "tensor", "pipeline")
DATA_PARALLEL = ("ddp", "fsdp")  # weak scaling: each rank its own share of the data


def run_task(task: str, params: Mapping, processes: int, backend: str = "gloo", *, timeout_s: float = TIMEOUT_S,
             output: Path | None = None) -> list[dict]:
    """Run one of this module's tasks on ``processes`` ranks; each rank's report (rank 0 first), with its ``rows``.

    ``output`` (a folder) keeps the files a task writes besides its rows. A rank's error becomes a
    :class:`LaunchError` with that rank's traceback; nccl on fewer GPUs than ``processes``, a ValueError.
    """
    if task not in TASKS:
        raise ValueError(f"task: one of {', '.join(TASKS)}, got {task!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: one of {', '.join(BACKENDS)}, got {backend!r}")
    check_gpus(backend, [processes])
    with tempfile.TemporaryDirectory(prefix="gpulab_parallel_") as scratch:
        folder = Path(output or scratch)
        arguments = ["-m", "gpulab.ch16_distributed_training.parallel", task, "--backend", backend, "--out",
                     str(folder), "--params", json.dumps(dict(params))]
        failure = None
        try:
            launch(arguments, processes, timeout_s=timeout_s)
        except LaunchError as error:
            failure = error
        reports = sorted((json.loads(p.read_text()) for p in folder.glob("rank*.json")), key=lambda r: r["rank"])
    errors = [r for r in reports if "error" in r]
    if errors or failure is not None:
        detail = f"rank {errors[0]['rank']}: {errors[0]['error']}" if errors else str(failure)
        raise LaunchError(f"task {task!r} on {processes} {backend} processes failed:\n{detail}",
                          getattr(failure, "returncode", 1), getattr(failure, "stderr", ""),
                          getattr(failure, "timed_out", False))
    if len(reports) != processes:
        raise LaunchError(f"task {task!r}: {len(reports)} of {processes} ranks reported", 0, "")
    return reports


def _tensor_task(device: torch.device, folder: Path, sizes: Sequence[int], batch: int, seed: int) -> list[dict]:
    """One step of the tensor-parallel MLP on the whole batch; rank 0 saves the output and the gathered gradients."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, X, labels = ddp.gradient_problem(sizes, batch, seed)
    log: list[dict] = []
    split = tensor_parallel.shard_mlp(model, rank, world, log).to(device)
    output = split(X.to(device))  # every rank the whole batch, and in the end the whole output
    loss = F.cross_entropy(output, labels.to(device))
    loss.backward()
    gradients = tensor_parallel.gathered_gradients(split)
    if rank == 0:
        torch.save({"gradients": gradients, "output": output.detach().cpu()}, folder / "gradients.pt")
    return [{"rank": rank, "loss": loss.item(), "allreduces": log}]


def _pipeline_task(device: torch.device, folder: Path, sizes: Sequence[int], batch: int, micro_batches: int,
                   schedule: str, seed: int) -> list[dict]:
    """One pipelined step; every stage saves its own gradients, the last stage reports the loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, X, labels = ddp.gradient_problem(sizes, batch, seed)
    stage = pipeline.stage_module(model, rank, world).to(device)
    loss, intervals = pipeline.pipeline_step(stage, X, labels, micro_batches, schedule)
    torch.save({name: p.grad.detach().cpu() for name, p in stage.named_parameters()}, folder / f"gradients{rank}.pt")
    return [{"rank": rank, "loss": None if loss is None else loss.item(), "intervals": intervals}]


def _sharded_task(device: torch.device, folder: Path, sizes: Sequence[int], batch: int, seed: int) -> list[dict]:
    """One FSDP step (Adam) on this rank's share of the batch, then one DDP step: the bytes each stores."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    if batch % world:
        raise ValueError(f"batch: {batch} does not split into {world} equal shares, one per rank")
    share = slice(rank * batch // world, (rank + 1) * batch // world)
    stored = {}
    for strategy in ("ddp", "fsdp"):
        model, X, labels = ddp.gradient_problem(sizes, batch, seed)
        model = model.to(device)
        wrapped = DDP(model) if strategy == "ddp" else sharded.shard(model, device)
        optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
        loss = F.cross_entropy(wrapped(X[share].to(device)), labels[share].to(device))
        loss.backward()
        if strategy == "fsdp":  # the gradients, before the step changes the weights they were taken at
            gradients = sharded.gathered_gradients(wrapped)
        optimizer.step()  # creates Adam's state: two numbers per parameter, sharded as the parameters are
        stored[strategy] = sharded.state_bytes(wrapped, optimizer)
    if rank == 0:
        torch.save(gradients, folder / "gradients.pt")
    return [{"rank": rank, "loss": loss.item(), **stored}]


def _timed_step(strategy: str, device: torch.device, sizes: Sequence[int], X: torch.Tensor, labels: torch.Tensor,
                precision: str, micro_batches: int, schedule: str, learning_rate: float, seed: int
                ) -> tuple[Callable[[], torch.Tensor | None], torch.nn.Module, list]:
    """A training step of ``strategy`` on this rank (SGD, like :func:`.ddp._training_step`), its model and its log."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.random.fork_rng(devices=[]):
        model = mlp.torch_mlp(sizes, seed=seed).to(device)
    log: list = []
    if strategy == "ddp":
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    elif strategy == "fsdp":
        model = sharded.shard(model, device)
    elif strategy == "tensor":
        model = tensor_parallel.shard_mlp(model, rank, world, log)
    if strategy != "pipeline":
        return ddp._training_step(model, [(X, labels)], precision, learning_rate), model, log
    stage = pipeline.stage_module(model, rank, world)
    optimizer = torch.optim.SGD(stage.parameters(), lr=learning_rate)

    def step() -> torch.Tensor | None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
            loss, intervals = pipeline.pipeline_step(stage, X if rank == 0 else None, labels, micro_batches, schedule)
        optimizer.step()
        log[:] = intervals  # the last step's compute intervals
        return loss

    return step, stage, log


def _timing_task(device: torch.device, folder: Path, runs: Sequence[Mapping], **common) -> list[dict]:
    """Each of ``runs`` (a strategy, batch and precision, and for a pipeline its micro-batches and schedule) timed in
    turn, in one launch: one row each. ``common``: the arguments of :func:`_time_strategy` that every run shares."""
    return [_time_strategy(device, **run, **common) for run in runs]


def _time_strategy(device: torch.device, strategy: str, sizes: Sequence[int], batch: int, precision: str,
                   micro_batches: int, schedule: str, warmup: int, repeats: int, learning_rate: float,
                   seed: int) -> dict:
    """A step of ``strategy`` timed on all ranks together, after the whole model alone on each rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if precision not in ddp.SCALING_PRECISIONS:
        raise ValueError(f"precision: one of {', '.join(ddp.SCALING_PRECISIONS)}, got {precision!r}")
    generator = torch.Generator().manual_seed(seed + 1 + (rank if strategy in DATA_PARALLEL else 0))
    X = torch.randn(batch, sizes[0], generator=generator).to(device)
    labels = torch.randint(0, sizes[-1], (batch,), generator=generator).to(device)
    cuda = device.type == "cuda"
    with matmul_mode("tf32" if precision == "tf32" else "float32"):
        with torch.random.fork_rng(devices=[]):
            alone = mlp.torch_mlp(sizes, seed=seed).to(device)
        ddp._barrier(device)
        single = timing.measure(ddp._training_step(alone, [(X, labels)], precision, learning_rate), device=device,
                                warmup=warmup, repeats=repeats, flush_l2=False)
        del alone
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        step, model, log = _timed_step(strategy, device, sizes, X, labels, precision, micro_batches, schedule,
                                       learning_rate, seed)
        ddp._barrier(device)
        together = timing.measure(step, device=device, warmup=warmup, repeats=repeats, flush_l2=False)
        ddp._barrier(device)
        log.clear()
        step()  # once more, alone, for the pipeline's compute intervals and tensor parallelism's messages
    peak = ddp._max_over_ranks(torch.cuda.max_memory_allocated(device), device) if cuda else None
    stored = sharded.state_bytes(model)
    single_s, together_s = ddp._max_over_ranks(single.median_s, device), ddp._max_over_ranks(together.median_s, device)
    samples = batch * (world if strategy in DATA_PARALLEL else 1)  # per step, all ranks together
    row = {"strategy": strategy, "devices": world, "sizes": list(sizes), "batch_per_device": batch,
           "precision": precision, "samples_per_step": samples, "single_seconds": single_s,
           "seconds": together_s, "spread": together.spread, "samples_per_s": samples / together_s,
           "efficiency": single_s / together_s if strategy in DATA_PARALLEL else single_s / (world * together_s),
           "peak_memory_bytes": peak, "state_bytes": ddp._max_over_ranks(sum(stored.values()), device),
           "predicted_sent_bytes": predicted_sent_bytes(strategy, sizes, batch, world, micro_batches, precision),
           "status": "ok"}
    if strategy == "tensor":
        row["counted_allreduce_bytes"] = sum(entry["bytes"] for entry in log) if rank == 0 else None
    if strategy == "pipeline":
        everyone = [None] * world
        dist.all_gather_object(everyone, [{**interval, "stage": rank} for interval in log])
        intervals = [interval for stage in everyone for interval in stage]
        row.update({"micro_batches": micro_batches, "schedule": schedule, "intervals": intervals,
                    "bubble": pipeline.bubble_fraction(intervals),
                    "bubble_formula": pipeline.bubble_formula(world, micro_batches)})
    del step, model, log
    if cuda:
        torch.cuda.empty_cache()
    return row


def predicted_sent_bytes(strategy: str, sizes: Sequence[int], batch: int, world: int, micro_batches: int = 1,
                         precision: str = "float32") -> float:
    """Bytes the busiest rank sends per step under ``strategy``, from the model alone.

    DDP and FSDP move float32 gradients and weights (:func:`.sharded.communication_bytes`); tensor and
    pipeline parallelism move activations, 2 bytes a number under bfloat16 autocast, else 4 (a pipeline's
    messages are float32 whatever the precision, :func:`.pipeline.pipeline_step`).
    """
    if strategy in DATA_PARALLEL:
        return sharded.communication_bytes(sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:], strict=False)),
                                           world, strategy)
    if strategy == "tensor":
        return tensor_parallel.traffic(sizes, batch, world, 2 if precision == "bfloat16" else 4)["sent_bytes"]
    with torch.device("meta"):  # the layers' shapes without their numbers
        model = mlp.torch_mlp(sizes)
    return max(pipeline.sent_bytes(model, world, batch))

TASKS: dict[str, Callable[..., list[dict]]] = {
    "tensor": _tensor_task, "pipeline": _pipeline_task, "sharded": _sharded_task, "timing": _timing_task}


def main(argv: Sequence[str] | None = None) -> int:
    """A worker's entry point (``python -m gpulab.ch16_distributed_training.parallel TASK --out FOLDER ...``).

    Writes ``FOLDER/rank<R>.json``: the task's rows, or the error's traceback.
    """
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--backend", choices=BACKENDS, default="gloo")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", default="{}", help="the task's keyword arguments, as JSON")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    report: dict = {"rank": rank}
    try:
        device = ddp._initialise(args.backend, ddp.COLLECTIVE_TIMEOUT_S)
        report["rows"] = TASKS[args.task](device, args.out, **json.loads(args.params))
        report["device"] = env.describe(device).name
        report["nccl_version"] = ddp._nccl_version() if args.backend == "nccl" else None
    except Exception:  # reported to the notebook, which raises it there with this traceback
        report["error"] = traceback.format_exc()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    if "error" in report:
        os._exit(1)  # at once: the other ranks may be stuck in a collective this rank will never join
    dist.destroy_process_group()
    return 0


def parallel_gradients(strategy: str, sizes: Sequence[int], batch: int, processes: int = 2, *, micro_batches: int = 2,
                       schedule: str = "gpipe", seed: int = 0, timeout_s: float = TIMEOUT_S) -> dict:
    """One training step of :func:`.ddp.gradient_problem` under ``strategy`` ('tensor', 'pipeline' or 'fsdp') on
    ``processes`` gloo processes: the loss of the whole batch, every parameter's whole gradient by name, and
    each rank's rows (for a pipeline, its compute intervals; for FSDP, the bytes it stores).

    The arguments are checked here, before any process starts, with a ValueError that says what is wrong.
    """
    sizes, batch, processes = positive_ints("sizes", sizes), positive_int("batch", batch), positive_int(
        "processes", processes)
    params = {"sizes": sizes, "batch": batch, "seed": seed}
    if strategy == "tensor":
        tensor_parallel.check_widths(sizes, processes)
    elif strategy == "pipeline":
        with torch.device("meta"):
            pipeline.stage_bounds(mlp.torch_mlp(sizes), processes)  # raises if there are more stages than layers
        pipeline.stage_order(0, processes, micro_batches, schedule)  # raises on a bad schedule or count
        if batch % micro_batches:
            raise ValueError(f"micro_batches: the batch of {batch} samples does not split into {micro_batches} "
                             "equal micro-batches")
        params.update(micro_batches=micro_batches, schedule=schedule)
    elif strategy == "fsdp":
        if batch % processes:
            raise ValueError(f"batch: {batch} does not split into {processes} equal shares, one per rank")
    else:
        raise ValueError(f"strategy: one of tensor, pipeline, fsdp, got {strategy!r}")
    task = "sharded" if strategy == "fsdp" else strategy
    with tempfile.TemporaryDirectory(prefix="gpulab_parallel_") as folder:
        reports = run_task(task, params, processes, "gloo", timeout_s=timeout_s, output=Path(folder))
        saved = [torch.load(path) for path in sorted(Path(folder).glob("gradients*.pt"))]
    rows = [report["rows"][0] for report in reports]
    if strategy == "tensor":
        gradients, loss = saved[0]["gradients"], rows[0]["loss"]
    elif strategy == "pipeline":
        gradients, loss = {name: g for stage in saved for name, g in stage.items()}, rows[-1]["loss"]
    else:  # equal shares: the batch's mean loss is the mean of the ranks' means
        gradients, loss = saved[0], sum(row["loss"] for row in rows) / processes
    return {"loss": loss, "gradients": gradients, "rows": rows, **({"output": saved[0]["output"]}
                                                                   if strategy == "tensor" else {})}


def _timing_rows(runs: list[dict], sizes: Sequence[int], processes: Sequence[int], backend: str, *, warmup: int,
                 repeats: int, learning_rate: float, seed: int, timeout_s: float) -> list[dict]:
    """The ``timing`` task's rows for ``runs`` (each a strategy, batch and precision, and for a pipeline its
    micro-batches and schedule) on each number of ``processes``: one launch per number."""
    for run in runs:
        positive_int("batch", run["batch"])
        dtype_name(run["precision"], "precision")
    params = {"runs": runs, "sizes": positive_ints("sizes", sizes), "warmup": warmup,
              "repeats": positive_int("repeats", repeats), "learning_rate": learning_rate, "seed": seed}
    rows = []
    for count in processes:
        reports = run_task("timing", params, count, backend, timeout_s=timeout_s)
        rows += [{**row, "backend": backend, "device": reports[0]["device"], "nccl_version": reports[0]["nccl_version"]}
                 for row in reports[0]["rows"]]
    return rows


@experiment("distributed_parallel_scaling", runs=("main",))
def parallel_scaling(sizes: Sequence[int], batches: Sequence[int], strategies: Sequence[str] = STRATEGIES,
                     processes: Sequence[int] = (2,), backend: str = "gloo", precisions: Sequence[str] = ("bfloat16",),
                     *, micro_batches: int = 8, schedule: str = "1f1b", warmup: int = 3, repeats: int = 10,
                     learning_rate: float = 1e-3, seed: int = 0, timeout_s: float = TIMEOUT_S) -> list[dict]:
    """A training step of the MLP ``sizes`` under each strategy, on each number of ``processes``, against one device,
    for each of ``batches`` and ``precisions``.

    One row per precision, batch, strategy and process count: the step's time together (``seconds``) and alone
    (``single_seconds``, the whole model on ``batch`` samples on one device), samples per second, scaling
    efficiency (weak for DDP and FSDP, whose ``batch`` is per device; strong for tensor and pipeline
    parallelism, which split one ``batch``), the peak memory of the busiest GPU
    (``torch.cuda.max_memory_allocated``, None on CPU), the bytes it stores for parameters and gradients
    (``state_bytes``), and the bytes it sends per step as the model predicts (``predicted_sent_bytes``).
    The step is plain SGD, as in :mod:`.ddp`: no optimizer state. All runs of one process count share one
    launch. ``backend`` 'nccl' needs a GPU per process and says so before starting anything.
    """
    check_gpus(backend, processes)
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategies: each one of {', '.join(STRATEGIES)}, got {strategy!r}")
    runs = [{"strategy": strategy, "batch": batch, "precision": precision, "micro_batches": micro_batches,
             "schedule": schedule} for precision in precisions for batch in positive_ints("batches", batches)
            for strategy in strategies]
    return _timing_rows(runs, sizes, processes, backend, warmup=warmup, repeats=repeats,
                        learning_rate=learning_rate, seed=seed, timeout_s=timeout_s)


@experiment("distributed_pipeline_bubble", runs=("main",))
def pipeline_bubble(sizes: Sequence[int], batch: int, micro_batches: Sequence[int] = (1, 2, 4, 8, 16),
                    schedules: Sequence[str] = pipeline.SCHEDULES, processes: Sequence[int] = (2,),
                    backend: str = "gloo", precision: str = "bfloat16", *, warmup: int = 3, repeats: int = 10,
                    seed: int = 0, timeout_s: float = TIMEOUT_S) -> list[dict]:
    """The measured bubble of a pipelined step of the MLP ``sizes`` (one stage per process) against
    (p - 1) / (m + p - 1), for each schedule, number of micro-batches m and number of processes p.

    Each row is :func:`parallel_scaling`'s for the pipeline, with the stages' compute intervals of one
    step and ``bubble``, the idle share they leave (:func:`.pipeline.bubble_fraction`). Waiting for a
    message counts as idle: the formula's stages send in no time, real ones do not.
    """
    check_gpus(backend, processes)
    runs = [{"strategy": "pipeline", "batch": batch, "precision": precision, "micro_batches": m, "schedule": schedule}
            for schedule in schedules for m in positive_ints("micro_batches", micro_batches)]
    return _timing_rows(runs, sizes, processes, backend, warmup=warmup, repeats=repeats, learning_rate=1e-3,
                        seed=seed, timeout_s=timeout_s)


if __name__ == "__main__":
    sys.exit(main())
