"""2:4 sparsity on the tensor cores: the sparse peaks, what torch's backends accept, and a 2:4 linear layer
timed against the dense one, checked against float64 first.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from gpulab.ch15_structured_sparsity.patterns import compressed_size, prune_2_4
from gpulab.core import env, flops, specs, timing
from gpulab.core.correctness import check_close, random_tensor, relative_error
from gpulab.core.precision import MATMUL_TOLERANCE, float32_accumulation
from gpulab.core.provenance import experiment
from gpulab.core.sweep import run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, unsupported_reason

SPARSE_MATH_FACTOR = 2  # a sparse tensor core skips the zero half of A: twice the dense FMA per clock
SPARSE_TENSOR_CORES_FROM = (8, 0)  # Ampere


def _capability(row: specs.GPU) -> tuple[int, int]:
    major, minor = row.compute_capability.split(".")
    return int(major), int(minor)


def sparse_peak(row: specs.GPU, precision: str) -> specs.Peak:
    """The 2:4 sparse tensor-core peak of ``row`` in ``precision``: the dense peak of :func:`gpulab.core.specs.peak`
    with :data:`SPARSE_MATH_FACTOR` times the FMA per clock, counted as the dense product's FLOP (the zeros'
    multiplications included), as datasheets quote it. ValueError before Ampere, and for float64 (no sparse
    FP64 tensor cores)."""
    if _capability(row) < SPARSE_TENSOR_CORES_FROM:
        raise ValueError(f"row: the {row.name} ({row.architecture}, compute capability {row.compute_capability}) "
                         "has no sparse tensor cores; they arrived with Ampere (8.0)")
    if precision == "float64":
        raise ValueError("precision: the FP64 tensor cores have no sparse mode")
    dense = specs.peak(row, precision, specs.TENSOR_CORES)
    return dataclasses.replace(dense, fma_per_clock_per_sm=SPARSE_MATH_FACTOR * dense.fma_per_clock_per_sm)


def peak_rows(names: Sequence[str], precision: str = "float16") -> list[dict]:
    """Each GPU's dense and 2:4 sparse tensor-core peak in ``precision`` (TFLOP/s), with the sparse formula; a GPU
    without sparse tensor cores gets None and the reason."""
    rows = []
    for name in names:
        row = specs.gpu(name)
        dense = specs.peak(row, precision, specs.TENSOR_CORES)
        try:
            sparse = sparse_peak(row, precision)
            rows.append({"gpu": row.name, "architecture": row.architecture, "dense_tflops": dense.tflops,
                         "sparse_tflops": sparse.tflops, "formula": sparse.formula(), "reason": None})
        except ValueError as error:
            rows.append({"gpu": row.name, "architecture": row.architecture, "dense_tflops": dense.tflops,
                         "sparse_tflops": None, "formula": None, "reason": str(error).split(": ", 1)[1]})
    return rows





BACKENDS = ("cusparselt", "cutlass")  # torch's two 2:4 backends; "dense" is cuBLAS on the same pruned weights
DENSE_BACKEND = "dense"
CHECK_ROWS = 256  # rows (tokens) of a product compared with float64
SPEEDUP_DTYPES = ("float16", "bfloat16")  # the 16-bit formats both backends take, dense and sparse alike


def semi_structured_constraints() -> list[dict]:
    """What torch's 2:4 backends accept, read from torch itself: per backend and dtype, the multiples the sparse
    matrix's rows and columns must be, and those the dense operand is padded to. Empty if this torch has none."""
    import torch.sparse as sparse

    rows = []
    for backend, cls_name in (("cusparselt", "SparseSemiStructuredTensorCUSPARSELT"),
                              ("cutlass", "SparseSemiStructuredTensorCUTLASS")):
        cls = getattr(sparse, cls_name, None)
        for dtype, config in getattr(cls, "_DTYPE_SHAPE_CONSTRAINTS", {}).items():
            rows.append({"backend": backend, "dtype": str(dtype).removeprefix("torch."),
                         "sparse_rows": config.sparse_min_rows, "sparse_columns": config.sparse_min_cols,
                         "dense_rows": config.dense_min_rows, "dense_columns": config.dense_min_cols})
    return rows


def semi_structured_unavailable(device: torch.device, dtype: str, backend: str) -> str | None:
    """None if ``device`` can multiply a 2:4 ``dtype`` matrix through torch's ``backend``; otherwise why not."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: one of {', '.join(BACKENDS)}, got {backend!r}")
    if device.type != "cuda":
        return (f"torch's 2:4 sparse matmuls run on NVIDIA GPUs of compute capability 8.0 or later; this device is "
                f"a {device.type.upper()}")
    capability = torch.cuda.get_device_capability(device)
    if capability < SPARSE_TENSOR_CORES_FROM:
        return (f"sparse tensor cores arrived with Ampere (compute capability 8.0); "
                f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}")
    if not hasattr(torch.sparse, "to_sparse_semi_structured"):
        return f"this torch ({torch.__version__}) has no torch.sparse.to_sparse_semi_structured"
    if backend == "cusparselt" and not torch.backends.cusparselt.is_available():
        return f"this torch ({torch.__version__}) was built without cuSPARSELt"
    reason = unsupported_reason(dtype, device)
    if reason is not None:
        return reason
    accepted = {r["dtype"] for r in semi_structured_constraints() if r["backend"] == backend}
    if dtype not in accepted:
        return f"torch's {backend} backend takes {', '.join(sorted(accepted)) or 'no dtype'}, not {dtype}"
    return None


@contextmanager
def semi_structured_backend(backend: str) -> Iterator[None]:
    """Within the block, ``torch.sparse.to_sparse_semi_structured`` compresses for ``backend``: torch's switch
    ``SparseSemiStructuredTensor._FORCE_CUTLASS`` set for 'cutlass', cleared for 'cusparselt', then restored."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: one of {', '.join(BACKENDS)}, got {backend!r}")
    cls = torch.sparse.SparseSemiStructuredTensor
    saved = cls._FORCE_CUTLASS
    cls._FORCE_CUTLASS = backend == "cutlass"
    try:
        yield
    finally:
        cls._FORCE_CUTLASS = saved


def to_semi_structured(W: torch.Tensor, backend: str) -> torch.Tensor:
    """``W`` (2:4, on a GPU) as torch's compressed ``SparseSemiStructuredTensor`` for ``backend``, without
    torch's one-time 'prototype' warning."""
    with semi_structured_backend(backend), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*SparseSemiStructuredTensor.*prototype")
        return torch.sparse.to_sparse_semi_structured(W)


def stored_bytes(sparse: torch.Tensor) -> int:
    """Bytes a ``SparseSemiStructuredTensor`` holds: its packed values and metadata (and their transposes, where
    it keeps them)."""
    parts = (getattr(sparse, name, None) for name in ("packed", "meta", "packed_t", "meta_t"))
    return sum(p.numel() * p.element_size() for p in parts if isinstance(p, torch.Tensor))


def _weight(n: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    """A random n x n weight pruned to 2:4 by magnitude, in ``dtype``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return prune_2_4(random_tensor((n, n), torch.float32, device, generator)).to(dtype)


def _inputs(tokens: int, n: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    """Random tokens x n inputs, scaled by 1/sqrt(n) so that the outputs are of order 1."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return (random_tensor((tokens, n), torch.float32, device, generator) / math.sqrt(n)).to(dtype)


def _check(product: torch.Tensor, X: torch.Tensor, W: torch.Tensor, tolerance: float, what: str) -> float:
    """Relative error of ``product`` (X W^T) against float64 on up to CHECK_ROWS random rows; raises above
    ``tolerance``."""
    rows = torch.randperm(X.shape[0], device=X.device)[:CHECK_ROWS]
    return check_close(product[rows], X[rows].double() @ W.double().T, tolerance, what)


def _timed(run: Callable[[], torch.Tensor], device: torch.device, n: int, tokens: int) -> dict:
    measured = timing.measure(run, device=device)
    return {"seconds": measured.median_s, "spread": measured.spread,
            "tflops": flops.gemm(tokens, n, n).flops / measured.median_s / 1e12}


@experiment("sparsity_linear_speedup")
def linear_speedup(weight_sizes: Sequence[int], tokens: Sequence[int], dtypes: Sequence[str] = ("float16", "bfloat16"),
                   backends: Sequence[str] = BACKENDS) -> list[dict]:
    """``F.linear(X, W)`` with a square 2:4 weight W (n x n, pruned by magnitude) and X of tokens x n: dense
    (cuBLAS, the pruned weight stored densely) and through each of torch's 2:4 ``backends``.

    A row per dtype, n, tokens and backend: the median time, its spread, TFLOP/s counted as the *dense*
    product's 2 x tokens x n^2 FLOP (so that rates compare directly), and the relative error against
    float64, checked before anything is timed (both results within the dtype's matmul tolerance). Sparse
    rows add 'speedup' (dense time / sparse time), 'compress_seconds' (converting W once), the backend
    torch really used, the bytes it stores as a share of the dense weight, and whether the output is
    contiguous. Where the device, the dtype or the backend cannot run, one row per (dtype, backend) says
    why ('not available: ...'); a size that does not fit is 'out of memory'. Sums are float32.
    """
    weight_sizes, tokens = positive_ints("weight_sizes", weight_sizes), positive_ints("tokens", tokens)
    if not dtypes or any(d not in SPEEDUP_DTYPES for d in dtypes):
        raise ValueError(f"dtypes: choose from {', '.join(SPEEDUP_DTYPES)}; got {list(dtypes)}")
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise ValueError(f"backends: choose from {', '.join(BACKENDS)}; got {unknown}")
    for n in weight_sizes:
        if n % 64:
            raise ValueError(f"weight_sizes: multiples of 64 (what both backends accept), got {n}")
    device = env.device()
    rows = []
    for dtype in dtypes:
        reasons = {b: semi_structured_unavailable(device, dtype, b) for b in backends}
        if all(reasons.values()):  # nothing sparse can run: no point timing the dense products
            rows += [{"dtype": dtype, "backend": b, "status": f"not available: {why}"} for b, why in reasons.items()]
            continue
        rows += [{"dtype": dtype, "backend": b, "status": f"not available: {why}"}
                 for b, why in reasons.items() if why]
        runnable = [b for b in backends if not reasons[b]]
        torch_dtype = getattr(torch, dtype)
        tolerance = MATMUL_TOLERANCE[dtype]
        for n in weight_sizes:
            rows += _one_weight(n, tokens, dtype, torch_dtype, runnable, tolerance, device)
    return rows


def _one_weight(n: int, tokens: Sequence[int], dtype: str, torch_dtype: torch.dtype, backends: Sequence[str],
                tolerance: float, device: torch.device) -> list[dict]:
    """The rows of :func:`linear_speedup` for one n x n weight."""
    size = torch.empty((), dtype=torch_dtype).element_size()
    try:
        # the float32 weight and its pruning, the pruned and compressed copies, the float64 copy of the checks
        fits_in_memory("weight_sizes", n * n * (3 * 4 + 3 * size + 8), device)
    except ValueError:
        return [{"dtype": dtype, "n": n, "tokens": t, "backend": b, "status": "out of memory"}
                for t in tokens for b in (DENSE_BACKEND, *backends)]
    W = _weight(n, torch_dtype, device, seed=n)
    compressed: dict[str, dict] = {}
    found = []
    for backend in backends:
        try:
            sparse = to_semi_structured(W, backend)
        except (RuntimeError, NotImplementedError) as error:  # torch refused this shape, dtype or GPU
            found += [{"dtype": dtype, "n": n, "tokens": t, "backend": backend,
                       "status": f"not available: {str(error).splitlines()[0]}"} for t in tokens]
            continue
        seconds = timing.measure(lambda b=backend: to_semi_structured(W, b), device=device, warmup=1, repeats=3,
                                 flush_l2=False).median_s
        compressed[backend] = {"weight": sparse, "compress_seconds": seconds,
                               "backend_used": getattr(sparse, "BACKEND", type(sparse).__name__),
                               "stored_fraction": stored_bytes(sparse) / (n * n * size)}

    def measure(dtype: str, n: int, tokens: int, backend: str) -> dict:
        fits_in_memory("tokens", 3 * tokens * n * size + 8 * CHECK_ROWS * n, device)
        X = _inputs(tokens, n, torch_dtype, device, seed=n + tokens)
        weight = W if backend == DENSE_BACKEND else compressed[backend]["weight"]

        def run() -> torch.Tensor:
            return F.linear(X, weight)

        with float32_accumulation():
            try:
                result = run()
            except (RuntimeError, NotImplementedError) as error:  # a shape or layout the backend refuses
                if "out of memory" in str(error).lower():
                    raise
                return {"refused": str(error).strip().splitlines()[0]}
            error = _check(result, X, W, tolerance, f"{backend} F.linear, {tokens} x {n} -> {n} in {dtype}")
            extra = {"output_contiguous": result.is_contiguous()}
            del result
            return {**_timed(run, device, n, tokens), "relative_error": error, **extra,
                    **{k: v for k, v in compressed.get(backend, {}).items() if k != "weight"}}

    for t in tokens:
        points = [{"dtype": dtype, "n": n, "tokens": t, "backend": b} for b in (DENSE_BACKEND, *compressed)]
        point_rows = run_sweep(measure, points)
        for r in point_rows:
            if "refused" in r:
                r["status"] = f"not available: {r.pop('refused')}"
        dense = point_rows[0]
        for r in point_rows[1:]:
            if r["status"] == "ok" and dense["status"] == "ok":
                r["speedup"] = dense["seconds"] / r["seconds"]
        found += point_rows
    return found


ORIENTATIONS = {  # what a reader might write with a 2:4 weight Ws (n x n) and inputs X (tokens x n)
    "F.linear(X, Ws)": lambda X, Ws: F.linear(X, Ws),  # X Ws^T, the layer: sparse weight on the right, transposed
    "Ws @ X.T": lambda X, Ws: Ws @ X.T,  # the same product transposed: sparse operand on the left
    "X @ Ws.T": lambda X, Ws: X @ Ws.T,
    "X @ Ws": lambda X, Ws: X @ Ws,  # sparse on the right, not transposed: groups along the wrong dimension
}


@experiment("sparsity_orientations")
def orientations(n: int = 1024, tokens: int = 1024, dtype: str = "float16", backends: Sequence[str] = BACKENDS
                 ) -> list[dict]:
    """Try each product of :data:`ORIENTATIONS` with a 2:4 n x n weight through each of torch's ``backends``.

    A row per expression and backend: 'ok' with the relative error against float64 and whether the result
    is contiguous; 'wrong result' (or 'wrong shape') if torch returned something else than the product the
    expression means; or 'not supported: <torch's message>'. A device that cannot run 2:4 at all gives
    one row per backend saying why.
    """
    n, tokens = positive_int("n", n), positive_int("tokens", tokens)
    device = env.device()
    rows = []
    for backend in backends:
        why = semi_structured_unavailable(device, dtype, backend)
        if why:
            rows.append({"backend": backend, "dtype": dtype, "status": f"not available: {why}"})
            continue
        W, X = _weight(n, getattr(torch, dtype), device, 0), _inputs(tokens, n, getattr(torch, dtype), device, 1)
        try:
            sparse = to_semi_structured(W, backend)
        except (RuntimeError, NotImplementedError) as error:
            rows.append({"backend": backend, "dtype": dtype, "status": f"not available: {str(error).splitlines()[0]}"})
            continue
        for expression, product in ORIENTATIONS.items():
            row = {"backend": backend, "dtype": dtype, "expression": expression, "n": n, "tokens": tokens}
            try:
                with float32_accumulation():
                    result = product(X, sparse)
            except (RuntimeError, NotImplementedError, ValueError, AssertionError, TypeError) as error:
                message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                rows.append({**row, "status": f"not supported: {message}"})
                continue
            reference = product(X.double(), W.double())  # what the expression means, in float64
            if tuple(result.shape) != tuple(reference.shape):
                rows.append({**row, "status": f"wrong shape: {tuple(result.shape)}, expected {tuple(reference.shape)}"})
                continue
            error = relative_error(result, reference)
            rows.append({**row, "relative_error": error, "output_contiguous": result.is_contiguous(),
                         "output_shape": list(result.shape),
                         "status": "ok" if error <= MATMUL_TOLERANCE[dtype] else "wrong result"})
    return rows


def speedup_statements(rows: Sequence[dict], gpu: specs.GPU | None = None) -> list[str]:
    """What the rows of :func:`linear_speedup` say, as sentences: per dtype and backend the best speed-up, its rate
    (and share of ``gpu``'s sparse peak), and from how many tokens each weight size is faster than dense; the
    dense product's best share of its peak; per backend, the one-time compression of the largest weight in
    dense products, the bytes stored, and whether ``F.linear``'s output is contiguous. Empty if nothing sparse ran.
    """
    ok = [r for r in rows if r.get("status") == "ok"]
    sparse = [r for r in ok if "speedup" in r]
    if not sparse:
        return []
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in sparse):
        for backend in BACKENDS:
            chosen = [r for r in sparse if r["dtype"] == dtype and r["backend"] == backend]
            if not chosen:
                continue
            best = max(chosen, key=lambda r: r["speedup"])
            pays = {n: min((r["tokens"] for r in chosen if r["n"] == n and r["speedup"] > 1), default=None)
                    for n in sorted({r["n"] for r in chosen})}
            where = "; ".join(f"{n:,}: " + (f"from {t:,} tokens" if t else "never") for n, t in pays.items())
            share = f" ({best['tflops'] / sparse_peak(gpu, dtype).tflops:.0%} of the sparse peak)" if gpu else ""
            lines.append(f"{dtype}, {backend}: best speed-up {best['speedup']:.2f}x at n = {best['n']:,} and "
                         f"{best['tokens']:,} tokens, {best['tflops']:,.0f} TFLOP/s{share}; faster than dense "
                         f"for n = {where}")
        dense = [r for r in ok if r["dtype"] == dtype and r["backend"] == DENSE_BACKEND]
        if dense and gpu:
            top = max(dense, key=lambda r: r["tflops"])
            lines.append(f"{dtype}, dense: at best {top['tflops']:,.0f} TFLOP/s, "
                         f"{top['tflops'] / specs.peak(gpu, dtype, specs.TENSOR_CORES).tflops:.0%} of the dense peak")
    largest = max(r["n"] for r in sparse)
    dense_at = {(r["dtype"], r["n"], r["tokens"]): r for r in ok if r["backend"] == DENSE_BACKEND}
    for backend in BACKENDS:
        chosen = [r for r in sparse if r["backend"] == backend and r["n"] == largest]
        if not chosen:
            continue
        r = max(chosen, key=lambda r: r["tokens"])
        dense = dense_at[r["dtype"], r["n"], r["tokens"]]
        bits = 8 * torch.empty((), dtype=getattr(torch, r["dtype"])).element_size()
        lines.append(f"{backend} (torch's {r['backend_used']}): compressing the {largest:,} x {largest:,} {r['dtype']} "
                     f"weight takes {1e3 * r['compress_seconds']:.1f} ms, the time of "
                     f"{r['compress_seconds'] / dense['seconds']:.1f} dense products of {r['tokens']:,} tokens; "
                     f"it stores {r['stored_fraction']:.1%} of the dense weight's bytes (the format's arithmetic: "
                     f"{compressed_size(bits).fraction_of_dense:.2%}); F.linear's output is "
                     f"{'contiguous' if r['output_contiguous'] else 'a transposed view (not contiguous)'}")
    return lines
