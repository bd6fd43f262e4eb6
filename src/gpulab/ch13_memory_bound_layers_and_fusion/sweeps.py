"""Chapter 13's measurements: memory-bound layers on the roofline, chains eager and through ``torch.compile``,
the hand-fused kernel against the copy, and horizontal fusion of many small updates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from gpulab.ch06_recurrent_and_attention import attention
from gpulab.ch13_memory_bound_layers_and_fusion.fusion import (
    CHAINS,
    KERNEL,
    KERNEL_FUNCTION,
    OPS,
    _failure,
    _gelu_approximation,
    _known,
    add_layer_norm,
    bias_gelu_dropout,
    chain_cost,
    check_dropout,
    check_fused,
    compile_unavailable,
    compiled,
    kernels_per_call,
    launch_shape,
    op_cost,
    prepared_bias_gelu_dropout,
)
from gpulab.core import env, flops, kernel_mode, rates, timing
from gpulab.core.correctness import check_close, random_tensor
from gpulab.core.provenance import experiment
from gpulab.core.roofline import Roofline
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints
from gpulab.kernels import cuda_c


def _timed_row(fn: Callable[[], object], cost: flops.Cost, device: torch.device, flush_l2: bool = True) -> dict:
    t = timing.measure(fn, device=device, flush_l2=flush_l2)
    return {"flops": cost.flops, "bytes": cost.bytes, "intensity": cost.intensity, "seconds": t.median_s,
            "spread": t.spread, "gflops": cost.flops / t.median_s / 1e9, "gbytes_per_s": cost.bytes / t.median_s / 1e9}


@experiment("fusion_roofline")
def pointwise_roofline(rows: int, cols: int, copy_bytes: int, matmul_n: int,
                       ceiling_dtypes: Sequence[str] = ("float32",), p: float = 0.1, seed: int = 0) -> list[dict]:
    """ReLU, GELU, LayerNorm, softmax and bias + GELU + dropout on a ``rows x cols`` float32 matrix, timed.

    The first rows are this device's roofline ceilings (:func:`gpulab.core.rates.ceilings`: a copy of
    ``copy_bytes`` and ``matmul_n``-sized matmuls in ``ceiling_dtypes``), with a key 'ceiling'. Then
    one row per layer (key 'op'): FLOPs, bytes (:func:`op_cost`; for the eager chain, what its three
    kernels move, :func:`chain_cost`), arithmetic intensity, seconds, GFLOP/s, GB/s and the fraction of
    the copy's bandwidth. On a GPU the chain also runs as the hand-fused kernel. Each layer is
    checked against float64 before it is timed.
    """
    rows, cols = positive_int("rows", rows), positive_int("cols", cols)
    device = env.device()
    n = rows * cols
    fits_in_memory("rows x cols", 4 * n * 4 + 8 * n * 2, device)
    ceilings = rates.ceilings(copy_bytes, matmul_n, list(ceiling_dtypes))
    copy = next(r["gbytes_per_s"] for r in ceilings if r["ceiling"] == "bandwidth" and r["status"] == "ok")
    x, bias, weight, shift = (random_tensor(shape, torch.float32, device) for shape in
                              ((rows, cols), (cols,), (cols,), (cols,)))
    x64 = x.double()
    layers = {
        "relu": (lambda: torch.relu(x), lambda: torch.relu(x64)),
        "gelu": (lambda: F.gelu(x), lambda: F.gelu(x64)),
        "layer_norm": (lambda: F.layer_norm(x, (cols,), weight, shift),
                       lambda: F.layer_norm(x64, (cols,), weight.double(), shift.double())),
        "softmax": (lambda: torch.softmax(x, dim=-1), lambda: torch.softmax(x64, dim=-1)),
    }
    out = []
    for name, (run, reference) in layers.items():
        error = check_close(run(), reference(), 1e-5, f"{name} of {rows} x {cols}")
        out.append({"op": OPS[name].label, "kind": "one layer", "kernels": 1, "n": n, "dtype": "float32",
                    "relative_error": error, **_timed_row(run, op_cost(name, n), device)})
    chain = CHAINS["bias_gelu_dropout"]
    expected = F.gelu(x.double() + bias.double())
    error = check_dropout(bias_gelu_dropout(x, bias, p), expected, p, "eager bias + GELU + dropout")
    del expected
    out.append({"op": f"{chain.label} (eager)", "kind": "chain, one kernel per layer", "kernels": len(chain.kernels),
                "n": n, "dtype": "float32", "relative_error": error,
                **_timed_row(lambda: bias_gelu_dropout(x, bias, p), chain_cost(chain.name, n), device)})
    if kernel_mode.on_gpu() and cols % 4 == 0:
        error = check_fused(x, bias, p, seed)
        target = torch.empty_like(x)
        launch = prepared_bias_gelu_dropout(x, bias, p, seed, target)
        out.append({"op": f"{chain.label} (fused, CUDA C)", "kind": "chain, one kernel", "kernels": 1, "n": n,
                    "dtype": "float32", "relative_error": error,
                    **_timed_row(launch, chain_cost(chain.name, n, fused=True), device)})
    for row in out:
        row["fraction_of_copy"] = row["gbytes_per_s"] / copy
    return [{**r, "kind": "ceiling"} for r in ceilings] + out


def roofline_of(rows: Sequence[dict], device_name: str) -> tuple[Roofline, list[dict]]:
    """The :class:`gpulab.core.roofline.Roofline` of :func:`pointwise_roofline`'s ceiling rows, and its layer rows."""
    ceilings = [r for r in rows if r.get("kind") == "ceiling"]
    return Roofline.from_rows(ceilings, device_name), [r for r in rows if r.get("kind") != "ceiling"]


def _chain_operands(chain: str, rows: int, cols: int, device: torch.device) -> tuple:
    if chain == "bias_gelu_dropout":
        return random_tensor((rows, cols), torch.float32, device), random_tensor((cols,), torch.float32, device)
    return (random_tensor((rows, cols), torch.float32, device), random_tensor((rows, cols), torch.float32, device),
            random_tensor((cols,), torch.float32, device), random_tensor((cols,), torch.float32, device))


def _chain_check(chain: str, operands: tuple, p: float) -> Callable[[torch.Tensor, str], float]:
    """A check of a chain's output against float64 (for dropout, of the kept elements and the share dropped)."""
    if chain == "bias_gelu_dropout":
        x, bias = operands
        expected = F.gelu(x.double() + bias.double())
        return lambda output, what: check_dropout(output, expected, p, what)
    x, residual, weight, shift = operands
    expected = F.layer_norm(x.double() + residual.double(), (x.shape[-1],), weight.double(), shift.double())
    return lambda output, what: check_close(output, expected, 1e-5, what)


def _chain_function(chain: str, p: float) -> Callable:
    if chain == "bias_gelu_dropout":
        def run(x, bias):
            return bias_gelu_dropout(x, bias, p)
        return run
    return add_layer_norm


@experiment("fusion_compile")
def compile_comparison(rows: int, cols: int, p: float = 0.1, use_compile: bool = True,
                       chains: Sequence[str] = tuple(CHAINS)) -> list[dict]:
    """Each chain of :data:`CHAINS` on a ``rows x cols`` float32 matrix, eager and through ``torch.compile``.

    A row per (chain, mode): the GPU kernels one call runs (from the profiler; None on a CPU) and their
    names, the bytes the mode moves (:func:`chain_cost`: eager, one kernel per layer; compiled, fused)
    and the fewest bytes the chain needs, the time, the bandwidth on both byte counts, and the
    compile time (first call). A compiled row has status 'skipped: ...' or 'compile failed: ...'
    when it could not run; the last row is a device copy of ``rows x cols`` floats, for scale.
    """
    rows, cols = positive_int("rows", rows), positive_int("cols", cols)
    for chain in chains:
        _known(chain, CHAINS, "chains")
    device = env.device()
    n = rows * cols
    fits_in_memory("rows x cols", 4 * n * 6 + 8 * n * 3, device)
    unavailable = "turned off (use_compile=False)" if not use_compile else compile_unavailable(device)
    out = []
    for chain in chains:
        spec = CHAINS[chain]
        operands = _chain_operands(chain, rows, cols, device)
        check = _chain_check(chain, operands, p)
        fn = _chain_function(chain, p)
        fewest = chain_cost(chain, n, fused=True)
        modes: list[tuple[str, Callable | None, float | None, str]] = [("eager", fn, None, "ok")]
        if unavailable:
            modes.append(("torch.compile", None, None, f"skipped: {unavailable}"))
        else:
            try:
                fast, compile_seconds = compiled(fn, *operands, device=device)
                modes.append(("torch.compile", fast, compile_seconds, "ok"))
            except Exception as error:  # inductor fails in many ways (a missing compiler, a backend error)
                modes.append(("torch.compile", None, None, f"compile failed: {_failure(error)}"))
        for mode, run, compile_seconds, status in modes:
            row = {"chain": chain, "label": spec.label, "mode": mode, "rows": rows, "cols": cols, "n": n, "p": p,
                   "status": status, "compile_seconds": compile_seconds, "min_bytes": fewest.bytes}
            if run is not None:
                error = check(run(*operands), f"{mode} {spec.label}")
                call = functools.partial(run, *operands)
                counted = kernels_per_call(call, device)
                timed = _timed_row(call, chain_cost(chain, n, fused=mode != "eager"), device)
                row.update(relative_error=error, kernels=counted and counted[0],
                           kernel_names=counted and "; ".join(counted[1]), **timed,
                           effective_gbytes_per_s=fewest.bytes / timed["seconds"] / 1e9)
            out.append(row)
        eager = out[-len(modes)]
        for row in out[-len(modes):]:
            if row.get("seconds"):
                row["speedup"] = eager["seconds"] / row["seconds"]
    copy = rates.measure_copy(4 * n, device)
    out.append({"chain": "copy", "label": "device copy of the matrix", "mode": "copy", "rows": rows, "cols": cols,
                "n": n, "status": "ok", "seconds": copy["seconds"], "spread": copy["spread"],
                "bytes": 2 * copy["nbytes"], "gbytes_per_s": copy["gbytes_per_s"],
                "effective_gbytes_per_s": copy["gbytes_per_s"]})
    for row in out:
        if row.get("effective_gbytes_per_s"):
            row["fraction_of_copy"] = row["effective_gbytes_per_s"] / copy["gbytes_per_s"]
    return out






DEFAULT_VARIANTS = ({"approximate": "none", "blocks_per_sm": 4}, {"approximate": "none", "blocks_per_sm": 8},
                    {"approximate": "tanh", "blocks_per_sm": 4})


@experiment("fusion_hand_kernel")
def hand_kernel(rows: int, cols: int, p: float = 0.1, seed: int = 1234,
                variants: Sequence[dict] = DEFAULT_VARIANTS, use_compile: bool = True) -> list[dict]:
    """Bias + GELU + dropout on a ``rows x cols`` float32 matrix: the hand-fused kernel in each of
    ``variants`` ({'approximate', 'blocks_per_sm'}), eager PyTorch, ``torch.compile``, and a device copy
    of the same bytes (x read once, y written once). GPU only.

    Every variant is first checked on small odd shapes and on the full input (:func:`check_fused`).
    A row per contender: seconds, bandwidth counting the fewest bytes (2 x 4 bytes per element),
    the fraction of the copy's bandwidth, and for the kernel its launch shape and registers.
    """
    rows, cols = positive_int("rows", rows), positive_int("cols", cols)
    kernel_mode.require_gpu("hand_kernel")
    device = env.device()
    n = rows * cols
    fits_in_memory("rows x cols", 4 * n * 5 + 8 * n * 4, device)
    variants = [{"approximate": _gelu_approximation(v.get("approximate", "none")),
                 "blocks_per_sm": positive_int("blocks_per_sm", v.get("blocks_per_sm", 4))} for v in variants]
    fewest = chain_cost("bias_gelu_dropout", n, fused=True)
    for shape in ((37, 1028), (3, 4), (1, 8)):  # a partial block of columns, a tiny matrix, a single row
        for v in variants:
            x, bias = _chain_operands("bias_gelu_dropout", *shape, device)
            check_fused(x, bias, p, seed, v["approximate"], v["blocks_per_sm"])
    x, bias = _chain_operands("bias_gelu_dropout", rows, cols, device)
    sms = env.describe().multiprocessors
    out = []
    for v in variants:
        error = check_fused(x, bias, p, seed, v["approximate"], v["blocks_per_sm"])
        target = torch.empty_like(x)
        launch = prepared_bias_gelu_dropout(x, bias, p, seed, target, v["approximate"], v["blocks_per_sm"])
        grid, block = launch_shape(rows, cols // 4, sms, v["blocks_per_sm"])
        defines = {"GELU_TANH": int(v["approximate"] == "tanh")}
        registers = cuda_c.compile_report(KERNEL, defines=defines).resources[KERNEL_FUNCTION].registers
        form = "erf" if v["approximate"] == "none" else "tanh"
        out.append({"contender": f"CUDA C, GELU {form}, {v['blocks_per_sm']} blocks/SM", "kind": "CUDA C",
                    **v, "grid": f"{grid[0]} x {grid[1]}", "block": f"{block[0]} x {block[1]}",
                    "registers": registers, "relative_error": error, "status": "ok",
                    **_timed_row(launch, fewest, device, flush_l2=False)})
    check = _chain_check("bias_gelu_dropout", (x, bias), p)
    fn = _chain_function("bias_gelu_dropout", p)
    error = check(fn(x, bias), "eager bias + GELU + dropout")
    out.append({"contender": "eager PyTorch (3 kernels)", "kind": "eager", "approximate": "none", "status": "ok",
                "relative_error": error, **_timed_row(lambda: fn(x, bias), fewest, device, flush_l2=False)})
    unavailable = "turned off (use_compile=False)" if not use_compile else compile_unavailable(device)
    row = {"contender": "torch.compile", "kind": "torch.compile", "approximate": "none",
           "status": f"skipped: {unavailable}" if unavailable else "ok"}
    if not unavailable:
        try:
            fast, row["compile_seconds"] = compiled(fn, x, bias, device=device)
            row["relative_error"] = check(fast(x, bias), "torch.compile bias + GELU + dropout")
            row.update(_timed_row(lambda: fast(x, bias), fewest, device, flush_l2=False))
        except Exception as error:  # inductor fails in many ways; the row says how
            row["status"] = f"compile failed: {_failure(error)}"
    out.append(row)
    copy = rates.measure_copy(4 * n, device)
    out.append({"contender": "device copy (read x, write y)", "kind": "copy", "status": "ok",
                "seconds": copy["seconds"], "spread": copy["spread"], "bytes": 2 * copy["nbytes"],
                "gbytes_per_s": copy["gbytes_per_s"]})
    for r in out:
        r.update(rows=rows, cols=cols, n=n, p=p)
        if r.get("gbytes_per_s"):
            r["fraction_of_copy"] = r["gbytes_per_s"] / copy["gbytes_per_s"]
    return out






HORIZONTAL_METHODS = ("one kernel per tensor", "torch._foreach_add_", "one flat buffer")


def parameter_sizes(layers: int, d_model: int) -> list[int]:
    """The element counts of the parameter tensors of
    :func:`gpulab.ch06_recurrent_and_attention.attention.transformer` (heads of 64, a feed-forward of 4 d_model): the
    tensors an optimizer updates, from large weights to small biases."""
    meta = torch.device("meta")  # shapes only: nothing is allocated or initialised
    with meta:
        model = attention.transformer(positive_int("layers", layers), positive_int("d_model", d_model),
                                      max(1, d_model // 64), 4 * d_model, meta)
    return [p.numel() for p in model.parameters()]


def _update_methods(sizes: list[int], start: torch.Tensor, grads: torch.Tensor, lr: float):
    """For each method: (a step function, a function returning the parameters as one flat tensor)."""
    def separate(t: torch.Tensor) -> list[torch.Tensor]:  # one allocation per tensor, as a model has
        return [piece.clone() for piece in t.split(sizes)]

    params, grad_list = separate(start), separate(grads)

    def per_tensor() -> None:
        for p, g in zip(params, grad_list, strict=True):
            p.add_(g, alpha=-lr)

    foreach_params, foreach_grads = separate(start), separate(grads)
    flat, flat_grads = start.clone(), grads.clone()
    return {
        "one kernel per tensor": (per_tensor, lambda: torch.cat(params)),
        "torch._foreach_add_": (lambda: torch._foreach_add_(foreach_params, foreach_grads, alpha=-lr),
                                lambda: torch.cat(foreach_params)),
        "one flat buffer": (lambda: flat.add_(flat_grads, alpha=-lr), lambda: flat),
    }


@experiment("fusion_horizontal")
def horizontal_fusion(d_models: Sequence[int], layers: int, learning_rate: float = 1e-3) -> list[dict]:
    """An SGD-style update ``p -= lr g`` of every parameter of a transformer (:func:`parameter_sizes`), three ways.

    One ``add_`` per tensor (a kernel each), ``torch._foreach_add_`` (PyTorch's multi-tensor apply:
    a few kernels, each updating many tensors), and one ``add_`` on a flat buffer that holds them all.
    Each is checked against float64 after one step, then timed. A row per (d_model, method): tensors,
    elements, GPU kernels per step (None on a CPU), seconds, GB/s (12 bytes per element: read p and
    g, write p) and the speed-up over one kernel per tensor.
    """
    d_models, layers = positive_ints("d_models", d_models), positive_int("layers", layers)
    device = env.device()
    out = []
    for d_model in d_models:
        sizes = parameter_sizes(layers, d_model)
        total = sum(sizes)
        fits_in_memory("d_models", 4 * total * 9 + 8 * total, device)
        start, grads = random_tensor((total,), torch.float32, device), random_tensor((total,), torch.float32, device)
        expected = start.double() - learning_rate * grads.double()
        rows = []
        for method, (step, result) in _update_methods(sizes, start, grads, learning_rate).items():
            step()
            error = check_close(result(), expected, 1e-6, f"{method}, d_model {d_model}")
            counted = kernels_per_call(step, device)
            t = timing.measure(step, device=device)
            rows.append({"d_model": d_model, "layers": layers, "tensors": len(sizes), "elements": total,
                         "method": method, "kernels": counted and counted[0],
                         "relative_error": error, "seconds": t.median_s, "spread": t.spread,
                         "gbytes_per_s": 12 * total / t.median_s / 1e9})
        for row in rows:
            row["speedup"] = rows[0]["seconds"] / row["seconds"]
        out += rows
        del start, grads, expected
    return out
