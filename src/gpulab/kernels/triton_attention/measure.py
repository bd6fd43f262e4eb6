"""The GPU experiment: the Triton FlashAttention against every SDPA backend, forward and forward + backward.

Every implementation computes ``F.scaled_dot_product_attention(q, k, v, is_causal=causal)`` on the same bfloat16
inputs: the Triton kernels of this package (:func:`.backward.attention`), and SDPA forced to each of its backends
with ``torch.nn.attention.sdpa_kernel``, as chapter 13's sweep does
(``gpulab.ch13_memory_bound_layers_and_fusion.blocked_attention.attention_sweep``): ``math`` (the scores in
memory), ``efficient`` (xFormers' memory-efficient kernel), ``flash`` (FlashAttention-2) and ``cudnn``.

**Work.** A forward pass is two ``seq x seq x head_dim`` matmuls per head, ``4 b h s^2 d`` FLOP; causal attention
needs half of it (the blocks right of the diagonal are skipped, not computed and masked), and it is counted as
half, so a causal TFLOP/s is comparable with a non-causal one. The backward is counted as 2.5 forwards (five
matmuls for the forward's two: ``S`` recomputed, ``dV``, ``dP``, ``dQ``, ``dK``), so forward + backward is
3.5 forwards, the convention of the FlashAttention papers. **Sizes** follow those papers too: a constant
``tokens = batch x seq`` (16k) and a model width of 2048 (``heads = 2048 / head_dim``), so every point moves
the same inputs and only the sequence length, and with it the work per token, grows.

**Before anything is timed**, each implementation is checked at a small length against float64 attention
(:func:`.reference.check_attention`: the output and all three gradients); a backend that refuses the inputs
(SDPA's "No available kernel", say cuDNN for some head size) gets a row with status ``not available: ...``
instead, and a size that does not fit gets ``out of memory`` (:func:`gpulab.core.sweep.run_sweep`).
:func:`versus_best_sdpa` reads the rows: the Triton forward as a fraction of the fastest SDPA backend at each point,
against the target (80% at 4k tokens and more, head size 128).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from gpulab.core import env, kernel_mode, timing
from gpulab.core.correctness import random_tensor
from gpulab.core.provenance import experiment
from gpulab.core.sweep import OUT_OF_MEMORY, _is_out_of_memory, run_sweep
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, supported_dtype, torch_dtype
from gpulab.kernels.triton_attention import backward as backward_module
from gpulab.kernels.triton_attention import forward as forward_module
from gpulab.kernels.triton_attention.backward import attention
from gpulab.kernels.triton_attention.forward import HEAD_DIMS
from gpulab.kernels.triton_attention.reference import check_attention

SDPA_BACKENDS = {  # name -> (label, the torch.nn.attention.SDPBackend member it forces)
    "sdpa-math": ("SDPA, math backend", "MATH"),
    "sdpa-efficient": ("SDPA, memory-efficient backend", "EFFICIENT_ATTENTION"),
    "sdpa-flash": ("SDPA, flash backend", "FLASH_ATTENTION"),
    "sdpa-cudnn": ("SDPA, cuDNN backend", "CUDNN_ATTENTION"),
}
IMPLEMENTATIONS = {"triton": "Triton FlashAttention", **{name: label for name, (label, _) in SDPA_BACKENDS.items()}}
BACKWARD_FACTOR = 2.5  # backward FLOP per forward FLOP
TARGET = 0.8  # the Triton forward at least 80% of the fastest SDPA backend ...
TARGET_FROM = {"seq_len": 4096, "head_dim": 128}  # ... at 4k tokens and more, head size 128


def forward_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
    """``4 b h s^2 d`` (two matmuls of ``s x s x d`` per head), half of it when causal."""
    return 4 * batch * heads * seq_len**2 * head_dim / (2 if causal else 1)


def implementation(name: str, forward_config: dict | None = None, backward_config: dict | None = None):
    """``fn(q, k, v, causal)`` for an implementation's name; SDPA's must run inside :func:`_context`."""
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"implementation: one of {', '.join(IMPLEMENTATIONS)}, got {name!r}")
    if name == "triton":
        return lambda q, k, v, causal: attention(q, k, v, causal, forward_config=forward_config,
                                                 backward_config=backward_config)
    return lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


@contextlib.contextmanager
def _context(name: str) -> Iterator[None]:
    """SDPA forced to the backend ``name`` (nothing for Triton), without SDPA's warnings about why it skips a
    backend. (Chapter 13's sweep forces its backends the same way; the kernels layer sits below the chapters, so
    the switch is here, where a chapter may import it.)"""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "triton":
            yield
        else:
            with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[name][1])):
                yield


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


def measure_point(implementation_name: str, seq_len: int, batch: int, heads: int, head_dim: int, causal: bool,
                  dtype: str, forward_config: dict | None = None, backward_config: dict | None = None) -> dict:
    """Seconds and TFLOP/s of one implementation's forward, and of its forward + backward, at one size.

    The backward is timed as ``torch.autograd.grad`` of the forward's output (so the forward is in it). A backend
    whose backward refuses, or runs out of memory where its forward did not (SDPA's math backend keeps the scores
    and their gradient), keeps its forward numbers and says why in ``backward_status``. The inputs are drawn on the
    device (:func:`gpulab.core.correctness.random_tensor`): their values do not change the time, and drawing them
    on the host would take longer than timing them.
    """
    device = env.device()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    size = torch.empty((), dtype=torch_dtype(dtype)).element_size()
    scores = batch * heads * seq_len**2 * 4 if implementation_name == "sdpa-math" else 0  # float32 scores, probs
    fits_in_memory("seq_len", 4 * batch * heads * seq_len * head_dim * size + 2 * scores, device)
    shape = (batch, heads, seq_len, head_dim)
    q, k, v, do = (random_tensor(shape, torch_dtype(dtype), device) for _ in range(4))
    fn = implementation(implementation_name, forward_config, backward_config)
    work = forward_flops(batch, heads, seq_len, head_dim, causal)
    with _context(implementation_name):
        t = timing.measure(lambda: fn(q, k, v, causal), device=device)
        row = {"forward_seconds": t.median_s, "forward_spread": t.spread, "forward_tflops": t.rate(work) / 1e12}
        q, k, v = (x.requires_grad_() for x in (q, k, v))

        def forward_backward():
            return torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)

        try:
            t = timing.measure(forward_backward, device=device)
        except RuntimeError as error:
            status = OUT_OF_MEMORY if _is_out_of_memory(error) else f"not available: {_first_line(error)}"
            return {**row, "backward_status": status}
    return {**row, "backward_status": "ok", "forward_backward_seconds": t.median_s,
            "forward_backward_spread": t.spread,
            "forward_backward_tflops": t.rate((1 + BACKWARD_FACTOR) * work) / 1e12}


def checked_implementations(names: Sequence[str], head_dim: int, causal: bool, dtype: str, check_len: int,
                            forward_config: dict | None = None,
                            backward_config: dict | None = None) -> tuple[list[str], list[dict]]:
    """The implementations that pass :func:`.reference.check_attention` at ``check_len`` tokens, and a row for each
    one that refuses the inputs (SDPA's RuntimeError). A wrong answer raises: nothing wrong is ever timed."""
    passed, refused = [], []
    for name in names:
        fn = implementation(name, forward_config, backward_config)
        try:
            with _context(name):
                check_attention(fn, 1, 2, check_len, head_dim, torch_dtype(dtype), causal, env.device(),
                                what=IMPLEMENTATIONS[name])
        except RuntimeError as error:  # "No available kernel": this backend cannot take these inputs here
            refused.append({"implementation": name, "label": IMPLEMENTATIONS[name], "head_dim": head_dim,
                            "causal": causal, "dtype": dtype, "seq_len": None,
                            "status": f"not available: {_first_line(error)}"})
            continue
        passed.append(name)
    return passed, refused


@experiment("triton_attention")
def attention_race(seq_lens: Sequence[int] = (1024, 2048, 4096, 8192, 16384), head_dims: Sequence[int] = (64, 128),
                   causals: Sequence[bool] = (False, True), implementations: Sequence[str] = tuple(IMPLEMENTATIONS),
                   tokens: int = 16384, model_dim: int = 2048, dtype: str = "bfloat16", check_len: int = 256,
                   forward_config: dict | None = None, backward_config: dict | None = None) -> list[dict]:
    """A row per (seq_len, head_dim, causal, implementation): forward and forward + backward time and TFLOP/s.

    ``batch = tokens / seq_len``, ``heads = model_dim / head_dim``. Each (head_dim, causal) checks every
    implementation first (:func:`checked_implementations`); refusing backends get one ``not available`` row.
    ``forward_config`` / ``backward_config`` override the Triton kernels' tile sizes. GPU only.
    """
    kernel_mode.require_gpu("attention_race")
    device = env.device()
    label = supported_dtype("dtype", dtype, device)
    seq_lens, head_dims = positive_ints("seq_lens", seq_lens), positive_ints("head_dims", head_dims)
    tokens, model_dim, check_len = (positive_int(n, v) for n, v in (("tokens", tokens), ("model_dim", model_dim),
                                                                     ("check_len", check_len)))
    for d in head_dims:
        if d not in HEAD_DIMS or model_dim % d:
            raise ValueError(f"head_dims: each one of {HEAD_DIMS} dividing model_dim {model_dim}, got {d}")
    for name in implementations:
        implementation(name)  # an unknown name fails here, before anything runs
    rows = []
    for head_dim in head_dims:
        for causal in causals:
            passed, refused = checked_implementations(implementations, head_dim, bool(causal), label, check_len,
                                                      forward_config, backward_config)
            points = [{"implementation_name": name, "seq_len": n, "batch": max(1, tokens // n),
                       "heads": model_dim // head_dim, "head_dim": head_dim, "causal": bool(causal), "dtype": label,
                       "forward_config": forward_config, "backward_config": backward_config}
                      for n in seq_lens for name in passed]
            for row in run_sweep(measure_point, points):
                name = row.pop("implementation_name")
                row.pop("forward_config"), row.pop("backward_config")
                rows.append({"implementation": name, "label": IMPLEMENTATIONS[name], **row})
            rows += refused
    return rows


def versus_best_sdpa(rows: Sequence[dict], key: str = "forward_tflops") -> list[dict]:
    """At each (seq_len, head_dim, causal): the Triton kernel's ``key`` as a fraction of the best SDPA backend's,
    which backend that was, and whether the point is one the target covers and meets (:data:`TARGET`)."""
    points: dict[tuple, dict] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get(key) is None:
            continue
        point = points.setdefault((row["seq_len"], row["head_dim"], row["causal"]), {})
        point[row["implementation"]] = row[key]
    out = []
    for (seq_len, head_dim, causal), rates in sorted(points.items()):
        sdpa = {name: rate for name, rate in rates.items() if name != "triton"}
        if "triton" not in rates or not sdpa:
            continue
        best = max(sdpa, key=sdpa.get)
        ratio = rates["triton"] / sdpa[best]
        covered = seq_len >= TARGET_FROM["seq_len"] and head_dim == TARGET_FROM["head_dim"]
        out.append({"seq_len": seq_len, "head_dim": head_dim, "causal": causal, "triton": rates["triton"],
                    "best_sdpa": best, "best_sdpa_rate": sdpa[best], "ratio": ratio, "target_applies": covered,
                    "meets_target": ratio >= TARGET if covered else None})
    return out


FORWARD_CANDIDATES = [  # tile sizes worth trying on an H100 / H200 (BLOCK_M a multiple of BLOCK_N)
    {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}
    for bm, bn in ((64, 64), (128, 32), (128, 64), (128, 128)) for w in (4, 8) for s in (2, 3, 4)
]


def tune_forward(seq_len: int = 4096, head_dim: int = 128, causal: bool = False, batch: int = 4, heads: int = 16,
                 dtype: str = "bfloat16", candidates: Sequence[dict] = tuple(FORWARD_CANDIDATES)) -> list[dict]:
    """Forward TFLOP/s of the Triton kernel for each candidate config (each checked first), fastest first; GPU only.
    A config the compiler cannot fit (shared memory, registers) gets its error as ``status``. Not a recording:
    it is how :data:`.forward.CONFIGS` is chosen."""
    kernel_mode.require_gpu("tune_forward")
    device, label = env.device(), supported_dtype("dtype", dtype, env.device())
    q, k, v = (random_tensor((batch, heads, seq_len, head_dim), torch_dtype(label), device) for _ in range(3))
    work = forward_flops(batch, heads, seq_len, head_dim, causal)
    rows = []
    for config in candidates:
        fn = implementation("triton", forward_config=config)
        try:
            check_attention(fn, 1, 2, 256, head_dim, torch_dtype(label), causal, device, gradients=False)
            t = timing.measure(lambda fn=fn: fn(q, k, v, causal), device=device)
        except Exception as error:  # noqa: BLE001  (triton's OutOfResources and compile errors alike)
            rows.append({**config, "status": _first_line(error)})
            continue
        rows.append({**config, "status": "ok", "seconds": t.median_s, "tflops": t.rate(work) / 1e12})
    return sorted(rows, key=lambda r: -r.get("tflops", 0.0))


KERNELS = {  # name -> (module, kernel's name, its block sizes from the module's CONFIGS)
    "forward": (forward_module, "forward_kernel", ("BLOCK_M", "BLOCK_N")),
    "key_value_grads": (backward_module, "key_value_grads_kernel", ("BLOCK_M1", "BLOCK_N1")),
    "query_grads": (backward_module, "query_grads_kernel", ("BLOCK_M2", "BLOCK_N2")),
}


def cross_compile(kernel: str = "forward", head_dim: int = 128, causal: bool = False, dtype: str = "bfloat16",
                  capability: int = 90, **config):
    """Compile one of :data:`KERNELS` for an NVIDIA GPU of compute ``capability`` without one (Triton's own ptxas);
    returns the compiled kernel, for :func:`gpulab.kernels.triton_gemm.ladder.evidence` (HGMMA on Hopper, shared
    memory per program). The kernels must be defined for compiling: ``TRITON_INTERPRET=0`` before the import."""
    import triton
    from triton.backends.compiler import GPUTarget

    from gpulab.kernels.triton_gemm.interpreter import interpreting

    if interpreting():
        raise RuntimeError("cross_compile: the kernels were defined for Triton's interpreter; set "
                           "TRITON_INTERPRET=0 before importing gpulab.kernels.triton_attention")
    if kernel not in KERNELS:
        raise ValueError(f"kernel: one of {', '.join(KERNELS)}, got {kernel!r}")
    module, name, blocks = KERNELS[kernel]
    merged = {**module.CONFIGS[head_dim], **config}
    fn = getattr(module, name)
    constants = {"HEAD_DIM": head_dim, "CAUSAL": causal, "BLOCK_M": merged[blocks[0]], "BLOCK_N": merged[blocks[1]]}
    short = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    signature = {arg: "constexpr" if arg in constants else "i32" if arg == "seq_len" else
                 "fp32" if arg in ("qk_scale", "scale") else "*fp32" if arg in ("LSE", "Delta") else f"*{short}"
                 for arg in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(fn.arg_names)
             if signature[arg].startswith("*") or arg == "seq_len"}  # as a launch on aligned tensors, 16 | seq_len
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs)
    options = {"num_warps": merged["num_warps"], "num_stages": merged["num_stages"]}
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
