"""The attention chapter's experiments: attention as batched GEMMs, a transformer block's FLOPs, a profiled step.

Self-attention is four GEMMs and a softmax: the projections ``Q = X W_Q``, ``K = X W_K``,
``V = X W_V``, the scores ``Q K^T / sqrt(d)``, a row-wise softmax, and ``A V``; multi-head attention
runs the middle two as one batched GEMM over (batch x heads) and ends with an output projection.
:func:`block_flops` counts a transformer block's GEMMs by formula (checked against
``torch.utils.flop_counter``), and :func:`training_step_profile` runs a small transformer's training
step under ``torch.profiler`` and sorts the time of its GPU kernels (or, on a CPU, its operators)
into GEMM and the rest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from gpulab.core import env, profiling, timing
from gpulab.core.correctness import check_close, random_tensor
from gpulab.core.provenance import experiment
from gpulab.core.validation import fits_in_memory, positive_int, positive_ints, supported_dtype

BLOCK_PARTS = ("QKV projections", "scores QK^T", "AV", "output projection", "MLP")
QUADRATIC_PARTS = ("scores QK^T", "AV")  # the parts whose work grows with the square of the sequence length






def scaled_dot_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` over the last two dimensions, as two (batched) GEMMs and a softmax."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # ... x L x L
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def self_attention(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor) -> torch.Tensor:
    """Single-head self-attention in the course's notation: ``Q = X W_Q``, ``K = X W_K``, ``V = X W_V``.

    ``x`` is ``... x L x D_x``; ``w_q`` and ``w_k`` are ``D_x x D_Q``, ``w_v`` is ``D_x x D_V``.
    """
    if w_q.shape != w_k.shape or w_q.shape[0] != x.shape[-1] or w_v.shape[0] != x.shape[-1]:
        raise ValueError(f"w_q, w_k, w_v: expected D_x x D_Q, D_x x D_Q, D_x x D_V with D_x = {x.shape[-1]}; got "
                         f"{tuple(w_q.shape)}, {tuple(w_k.shape)}, {tuple(w_v.shape)}")
    return scaled_dot_product(x @ w_q, x @ w_k, x @ w_v)


def multi_head_self_attention(x: torch.Tensor, in_proj_weight: torch.Tensor, in_proj_bias: torch.Tensor,
                              out_proj_weight: torch.Tensor, out_proj_bias: torch.Tensor, heads: int) -> torch.Tensor:
    """Multi-head self-attention of ``x`` (``B x L x E``) with the parameters of ``nn.MultiheadAttention``.

    One GEMM projects every token to its query, key and value (``E -> 3E``); the heads become a batch
    dimension, so the scores and ``A V`` are each one ``torch.bmm`` over ``B * heads`` small matrices;
    a last GEMM projects the concatenated heads back to ``E``.
    """
    batch, length, embed = x.shape
    heads = positive_int("heads", heads)
    if embed % heads:
        raise ValueError(f"heads: must divide the embedding size {embed}, got {heads}")
    if in_proj_weight.shape != (3 * embed, embed) or out_proj_weight.shape != (embed, embed):
        raise ValueError(f"in_proj_weight, out_proj_weight: expected {(3 * embed, embed)} and {(embed, embed)}, got "
                         f"{tuple(in_proj_weight.shape)} and {tuple(out_proj_weight.shape)}")
    d = embed // heads
    qkv = torch.addmm(in_proj_bias, x.reshape(batch * length, embed), in_proj_weight.t())  # (B L) x 3E

    def split_heads(t: torch.Tensor) -> torch.Tensor:  # (B L) x E -> (B heads) x L x d
        return t.reshape(batch, length, heads, d).transpose(1, 2).reshape(batch * heads, length, d)

    q, k, v = (split_heads(t) for t in qkv.chunk(3, dim=-1))
    scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)  # (B heads) x L x L
    context = torch.bmm(torch.softmax(scores, dim=-1), v)  # (B heads) x L x d
    context = context.reshape(batch, heads, length, d).transpose(1, 2).reshape(batch * length, embed)
    return torch.addmm(out_proj_bias, context, out_proj_weight.t()).reshape(batch, length, embed)


def check_attention(batch: int, seq_len: int, embed: int, heads: int, device: torch.device | None = None) -> list[dict]:
    """Compare :func:`self_attention` with ``F.scaled_dot_product_attention`` and :func:`multi_head_self_attention`
    with ``nn.MultiheadAttention`` on fresh random data (float32); raises if either differs, returns the errors."""
    device = device or env.device()
    batch, seq_len, embed, heads = (positive_int(n, v) for n, v in
                                    (("batch", batch), ("seq_len", seq_len), ("embed", embed), ("heads", heads)))
    fits_in_memory("seq_len", 4 * batch * heads * seq_len * seq_len * 4 * 3, device)
    x = random_tensor((batch, seq_len, embed), torch.float32, device)
    w_q, w_k, w_v = (random_tensor((embed, embed), torch.float32, device) / math.sqrt(embed) for _ in range(3))
    ours = self_attention(x, w_q, w_k, w_v)
    theirs = F.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)
    rows = [{"check": "self_attention vs F.scaled_dot_product_attention",
             "relative_error": check_close(ours, theirs, 1e-4, "self-attention")}]
    module = nn.MultiheadAttention(embed, heads, batch_first=True).to(device)
    nn.init.normal_(module.in_proj_bias)
    nn.init.normal_(module.out_proj.bias)  # nonzero biases, so a forgotten bias fails the check
    with torch.no_grad():
        theirs, _ = module(x, x, x, need_weights=False)
        ours = multi_head_self_attention(x, module.in_proj_weight, module.in_proj_bias, module.out_proj.weight,
                                         module.out_proj.bias, heads)
    rows.append({"check": "multi_head_self_attention vs nn.MultiheadAttention",
                 "relative_error": check_close(ours, theirs, 1e-4, "multi-head attention")})
    return rows






def block_flops(batch: int, seq_len: int, d_model: int, d_ff: int) -> dict[str, int]:
    """Forward FLOPs of the GEMMs of one transformer block, by part (the number of heads does not change them).

    For ``B`` sequences of ``L`` tokens of width ``d``: the Q, K, V projections ``3 x 2BLd^2``; the
    scores ``2BL^2 d``; ``A V`` ``2BL^2 d``; the output projection ``2BLd^2``; the MLP's two layers
    ``2 x 2BLd d_ff``. Softmax, layer norms and the residual additions are O(BLd) or O(BL^2) and not GEMMs.
    """
    b, n, d, f = (positive_int(k, v) for k, v in (("batch", batch), ("seq_len", seq_len), ("d_model", d_model),
                                                   ("d_ff", d_ff)))
    return {"QKV projections": 3 * 2 * b * n * d * d, "scores QK^T": 2 * b * n * n * d, "AV": 2 * b * n * n * d,
            "output projection": 2 * b * n * d * d, "MLP": 2 * 2 * b * n * d * f}


def quadratic_crossover(d_model: int, d_ff: int) -> int:
    """The sequence length at which the two L^2 GEMMs do as much work as all the others: ``4Ld = 8d^2 + 4d d_ff``."""
    return 2 * positive_int("d_model", d_model) + positive_int("d_ff", d_ff)


def flop_share_rows(seq_lens: Sequence[int], d_model: int, d_ff: int) -> list[dict]:
    """For each sequence length, each part's share of a block's GEMM FLOPs (rows of seq_len, part, flops, share)."""
    rows = []
    for n in positive_ints("seq_lens", seq_lens):
        parts = block_flops(1, n, d_model, d_ff)
        total = sum(parts.values())
        rows += [{"seq_len": n, "d_model": d_model, "d_ff": d_ff, "part": part, "flops": value, "share": value / total}
                 for part, value in parts.items()]
        quadratic = sum(parts[p] for p in QUADRATIC_PARTS)
        rows.append({"seq_len": n, "d_model": d_model, "d_ff": d_ff, "part": "QK^T + AV (quadratic in L)",
                     "flops": quadratic, "share": quadratic / total})
    return rows


def _counted(fn: Callable[[], object]) -> tuple[int, dict[str, int]]:
    with FlopCounterMode(display=False) as counter:
        fn()
    counts = counter.get_flop_counts()
    return counter.get_total_flops(), {module: sum(ops.values()) for module, ops in counts.items()}


def counted_flops(batch: int, seq_len: int, d_model: int, heads: int, d_ff: int) -> list[dict]:
    """:func:`block_flops` against ``FlopCounterMode`` on ``nn.TransformerEncoderLayer`` and on our own attention.

    Rows: what was counted, the formula's FLOPs and FlopCounterMode's. The layer runs in training
    mode with dropout off, and PyTorch's math backend of scaled_dot_product_attention, which does the
    scores and ``A V`` as ``bmm`` (the fused CPU kernel is not in FlopCounterMode's table, and would be missed).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    parts = block_flops(batch, seq_len, d_model, d_ff)
    forward = sum(parts.values())
    attention_formula = forward - parts["MLP"]
    layer = nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout=0.0, batch_first=True)  # float32, on the CPU
    x = torch.randn(batch, seq_len, d_model, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH):
        total, by_module = _counted(lambda: layer(x))
        y = layer(x)
        backward, _ = _counted(lambda: y.sum().backward())
    attention = layer.self_attn
    with torch.no_grad():
        ours, _ = _counted(lambda: multi_head_self_attention(
            x, attention.in_proj_weight, attention.in_proj_bias, attention.out_proj.weight, attention.out_proj.bias,
            heads))
    return [
        {"counted": "TransformerEncoderLayer forward", "formula": forward, "flop_counter": total},
        {"counted": "  its self-attention (projections, QK^T, AV)", "formula": attention_formula,
         "flop_counter": by_module.get("TransformerEncoderLayer.self_attn", 0)},
        {"counted": "  its MLP (linear1, linear2)", "formula": parts["MLP"],
         "flop_counter": by_module.get("TransformerEncoderLayer.linear1", 0)
         + by_module.get("TransformerEncoderLayer.linear2", 0)},
        {"counted": "TransformerEncoderLayer backward (2 x forward)", "formula": 2 * forward, "flop_counter": backward},
        {"counted": "our multi_head_self_attention", "formula": attention_formula, "flop_counter": ours},
    ]






CATEGORIES = ("GEMM", "attention (fused)", "softmax", "layer norm", "dropout", "elementwise", "reduction",
              "optimizer", "copy and cast", "other")
# GPU kernel names, matched in this order (lower case). cuBLAS GEMMs on Hopper are named nvjet_* or
# sm90_xmma_gemm_*, older ones ampere_*/sm80_*gemm*, CUTLASS ones cutlass_*; fused attention kernels
# (flash_*, fmha_*, cuDNN's *sdpa*) are matched first because some of them are CUTLASS kernels too.
KERNEL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("optimizer", r"multi_tensor_apply|adam|foreach"),
    ("attention (fused)", r"flash|fmha|attention|sdpa|mha_|cudnn::fusion"),
    ("GEMM", r"gemm|cutlass|cublas|xmma|nvjet|wgmma|sm90_|sm80_|ampere_|hopper_|splitk|gemv"),
    ("softmax", r"softmax"),
    ("layer norm", r"layer_?norm|gammabeta"),
    ("dropout", r"dropout|bernoulli|philox"),
    ("reduction", r"reduce"),
    ("copy and cast", r"memcpy|memset|copy|cat_|catarray"),
    ("elementwise", r"elementwise|pointwise|gelu|relu|threshold|vectorized|unrolled"),
)
# CPU operator names (the operator's own time, without what it calls).
OPERATOR_PATTERNS: tuple[tuple[str, str], ...] = (
    ("attention (fused)", r"^aten::_scaled_dot_product_\w*attention|^aten::_flash_attention"),
    ("GEMM", r"^aten::(mm|addmm|bmm|baddbmm|addbmm|_addmm_activation|mv|addmv)$"),
    ("softmax", r"softmax"),
    ("layer norm", r"layer_norm"),
    ("dropout", r"dropout|bernoulli"),
    ("reduction", r"^aten::(sum|mean|amax|max|min|norm|all|any)$"),
    ("copy and cast", r"^aten::(copy_|_to_copy|clone|cat|contiguous|to)$"),
    ("elementwise", r"^aten::(add|add_|sub|sub_|mul|mul_|div|div_|relu|relu_|gelu|gelu_backward|threshold_backward|"
                    r"where|clamp|clamp_min|pow|sqrt|exp|tanh|sigmoid|neg|rsub|fill_|zero_|masked_fill|masked_fill_|"
                    r"isneginf|isnan|logical_\w+|eq|ne|lt|gt|le|ge|square|mse_loss|mse_loss_backward|expand_as)$"),
)


def classify(name: str, patterns: Sequence[tuple[str, str]] = KERNEL_PATTERNS) -> str:
    """The category (one of :data:`CATEGORIES`) of a GPU kernel's or CPU operator's name."""
    lower = name.lower() if patterns is KERNEL_PATTERNS else name
    for category, pattern in patterns:
        if re.search(pattern, lower):
            return category
    return "other"


def transformer(layers: int, d_model: int, heads: int, d_ff: int, device: torch.device) -> nn.Module:
    """A stack of ``nn.TransformerEncoderLayer`` (dropout 0.1, GELU, pre-norm): the block GPT-style models use."""
    layer = nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout=0.1, activation="gelu", batch_first=True,
                                       norm_first=True)
    return nn.TransformerEncoder(layer, positive_int("layers", layers), enable_nested_tensor=False).to(device)


def _is_under_optimizer(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer."):
            return True
        parent = parent.cpu_parent
    return False


def profile_training_step(layers: int, d_model: int, heads: int, d_ff: int, batch: int, seq_len: int,
                          precision: str = "float32", steps: int = 3, device: torch.device | None = None) -> list[dict]:
    """Profile ``steps`` training steps (forward, backward, AdamW) of :func:`transformer`; a row per category.

    On a GPU the time is that of the GPU's kernels, sorted by kernel name (:data:`KERNEL_PATTERNS`);
    on a CPU it is each operator's own CPU time (:data:`OPERATOR_PATTERNS`; everything inside the
    optimizer's step counts as 'optimizer'). ``precision`` is 'float32' or, on a GPU, 'bfloat16'
    (autocast: GEMMs in bfloat16, weights and optimizer in float32). Each row has the category, its
    seconds per step, its share of the profiled time, and the step's wall time measured without the profiler.
    """
    device = device or env.device()
    label = supported_dtype("precision", precision, device)
    if label not in ("float32", "bfloat16") or (label == "bfloat16" and device.type != "cuda"):
        raise ValueError(f"precision: float32, or bfloat16 on a GPU; got {label} on {device.type}")
    steps = positive_int("steps", steps)
    parameters = layers * (4 * d_model * d_model + 2 * d_model * d_ff)
    activations = batch * seq_len * layers * (12 * d_model + 2 * d_ff + 3 * heads * seq_len)
    fits_in_memory("batch", 4 * (4 * parameters + activations), device)
    torch.manual_seed(0)
    model = transformer(layers, d_model, heads, d_ff, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = random_tensor((batch, seq_len, d_model), torch.float32, device)
    target = random_tensor((batch, seq_len, d_model), torch.float32, device)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=label == "bfloat16"):
            loss = F.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        return loss

    first = step().item()
    if not math.isfinite(first):
        raise AssertionError(f"training step: the loss is {first}")
    step_seconds = timing.measure(step, device=device, warmup=2, flush_l2=False).median_s
    prof = profiling.profile_calls(step, device, calls=steps)
    if device.type == "cuda":
        timed = [(classify(name), seconds) for name, seconds in profiling.device_kernels(prof)]
        source = "GPU kernels"
    else:
        timed = [("optimizer" if _is_under_optimizer(e) else classify(e.name, OPERATOR_PATTERNS),
                  e.self_cpu_time_total / 1e6) for e in prof.events()]
        source = "CPU operators"
    total = sum(seconds for _, seconds in timed)
    if not total > 0:
        raise AssertionError("profile: no timed kernels or operators were recorded")
    rows = []
    for category in CATEGORIES:
        seconds = sum(s for c, s in timed if c == category)
        count = sum(1 for c, _ in timed if c == category)
        rows.append({"precision": label, "source": source, "category": category, "seconds": seconds / steps,
                     "share": seconds / total, "count": count / steps, "step_seconds": step_seconds,
                     "profiled_seconds": total / steps})
    return rows


@experiment("attention_training_step")
def training_step_profile(layers: int, d_model: int, heads: int, d_ff: int, batch: int, seq_len: int,
                          precisions: Sequence[str], steps: int = 3) -> list[dict]:
    """:func:`profile_training_step` in each of ``precisions``: rows of precision, category, seconds and share."""
    return [row for p in precisions
            for row in profile_training_step(layers, d_model, heads, d_ff, batch, seq_len, p, steps)]
