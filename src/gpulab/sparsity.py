"""The experiments of the chapter "Structured sparsity": the 2:4 pattern, its compressed format, pruning a trained
network to it, and the sparse tensor cores measured through ``torch.sparse``.

From Ampere on, NVIDIA's tensor cores multiply a matrix A that has at most 2 nonzeros in every group of 4
consecutive values along the reduction dimension (*2:4 structured sparsity*) at twice the dense rate: they
read only the kept half of A, plus 2 bits per kept value saying where it sat in its group, and skip the
multiplications by zero. This module works that out and measures it:

- the format: :func:`compressed_size` does the storage arithmetic (values plus metadata, for any bits per
  value), :func:`compress` / :func:`decompress` convert a 2:4 matrix to that format and back in plain torch,
  and :func:`pack_indices` packs the 2-bit indices four to a byte, so the arithmetic is checked on real bytes;
- pruning: :func:`magnitude_2_4_mask` keeps the two largest magnitudes of each group, :func:`random_2_4_mask`
  two at random, :func:`magnitude_mask` the largest half of a whole matrix (unstructured);
  :func:`pruning_accuracy` trains an MLP on scikit-learn's digits, prunes it each way and fine-tunes it with
  the mask fixed (the recipe of NVIDIA's ASP: train dense, prune 2:4, retrain);
- the hardware: :func:`sparse_peak` is a GPU's 2:4 peak (twice its dense tensor-core peak of
  :mod:`gpulab.specs`), and :func:`linear_speedup` times ``torch.sparse.to_sparse_semi_structured`` weights in
  ``F.linear`` against the dense product with the same pruned weights, through both of torch's backends
  (cuSPARSELt and CUTLASS), every result first checked against float64, and :func:`speedup_statements` says
  what its rows show. :func:`orientations` tries the products torch does and does not support with a
  sparse operand.

Without an NVIDIA GPU of compute capability 8.0 or later the GPU experiments return rows whose status
says why, and the format and pruning work runs anywhere.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from gpulab import env, flops, mlp, plots, specs, timing
from gpulab.correctness import check_close, random_tensor, relative_error
from gpulab.precision import MATMUL_TOLERANCE, float32_accumulation
from gpulab.provenance import experiment
from gpulab.sweep import run_sweep
from gpulab.validation import fits_in_memory, positive_int, positive_ints, unsupported_reason

GROUP, KEPT = 4, 2  # at most KEPT nonzeros in every GROUP consecutive values along the reduction dimension

# ---------------------------------------------------------------------------------------------
# The compressed format: how many bits it takes


@dataclass(frozen=True)
class CompressedSize:
    """The storage of an N:M compressed matrix, per group of ``group`` values of ``value_bits`` each.

    ``kept`` values are stored, each with an index of its position in the group: ceil(log2(group)) bits
    (2 bits for 2:4). Everything is derived from the three numbers.
    """

    value_bits: int
    kept: int = KEPT
    group: int = GROUP

    @property
    def index_bits(self) -> int:
        """Bits that name one position out of ``group``: 2 for a group of 4."""
        return math.ceil(math.log2(self.group))

    @property
    def dense_bits(self) -> int:
        """Bits of one group stored densely."""
        return self.group * self.value_bits

    @property
    def value_bits_per_group(self) -> int:
        """Bits of the kept values of one group."""
        return self.kept * self.value_bits

    @property
    def metadata_bits(self) -> int:
        """Bits of the indices of one group: 2 x 2 = 4 for 2:4."""
        return self.kept * self.index_bits

    @property
    def metadata_overhead(self) -> float:
        """Metadata as a share of the kept values: 4 / 32 = 12.5% for 16-bit data, 4 / 16 = 25% for 8-bit."""
        return self.metadata_bits / self.value_bits_per_group

    @property
    def fraction_of_dense(self) -> float:
        """Values and metadata over the dense matrix: 36 / 64 = 0.5625 for 16-bit data, 20 / 32 = 0.625 for 8-bit."""
        return (self.value_bits_per_group + self.metadata_bits) / self.dense_bits


def compressed_size(value_bits: int, kept: int = KEPT, group: int = GROUP) -> CompressedSize:
    """The storage of ``kept``:``group`` sparsity for values of ``value_bits`` bits (:class:`CompressedSize`)."""
    value_bits, kept, group = positive_int("value_bits", value_bits), positive_int("kept", kept), \
        positive_int("group", group)
    if group < 2:
        raise ValueError(f"group: must be at least 2 values, got {group}")
    if kept >= group:
        raise ValueError(f"kept: must be fewer than the group's {group} values, got {kept}")
    return CompressedSize(value_bits, kept, group)


# The formats the sparse tensor cores take in 2:4, with their bits per value (cuSPARSELt's list; 32-bit data
# is sparse 1:2 instead, which this table leaves out).
SPARSE_FORMATS = {"float16": 16, "bfloat16": 16, "int8": 8, "float8_e4m3": 8}


def storage_rows(formats: Mapping[str, int] = SPARSE_FORMATS) -> list[dict]:
    """A row per format ({name: bits per value}): the bits of a dense group of 4, of its 2 kept values and of
    their metadata, the metadata overhead and the compressed size as a fraction of the dense one."""
    rows = []
    for name, bits in formats.items():
        size = compressed_size(bits)
        rows.append({"format": name, "value_bits": bits, "dense_bits": size.dense_bits,
                     "value_bits_kept": size.value_bits_per_group, "metadata_bits": size.metadata_bits,
                     "metadata_overhead": size.metadata_overhead, "fraction_of_dense": size.fraction_of_dense})
    return rows


# ---------------------------------------------------------------------------------------------
# Masks: which weights stay


def _groups(W: torch.Tensor, name: str = "W") -> torch.Tensor:
    """``W`` (rows x columns) viewed as rows x groups x 4; ValueError unless it is a matrix whose columns
    (the reduction dimension of ``x @ W.T``) split into whole groups."""
    if not isinstance(W, torch.Tensor) or W.dim() != 2:
        raise ValueError(f"{name}: expected a matrix (rows x columns), got {getattr(W, 'shape', type(W))}")
    if W.shape[1] % GROUP:
        raise ValueError(f"{name}: its {W.shape[1]} columns do not split into groups of {GROUP}; the reduction "
                         f"dimension must be a multiple of {GROUP}")
    return W.reshape(W.shape[0], W.shape[1] // GROUP, GROUP)


def _keep(positions: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A boolean mask of ``shape`` (rows x groups x 4) that is True at ``positions`` (rows x groups x KEPT)."""
    return torch.zeros(shape, dtype=torch.bool, device=positions.device).scatter_(-1, positions, True)


def magnitude_2_4_mask(W: torch.Tensor) -> torch.Tensor:
    """True at the two largest |w| of each group of 4 consecutive values of a row of ``W``.

    For an ``nn.Linear`` weight (outputs x inputs) the rows' direction is the reduction dimension of
    ``x @ W.T``, the one the sparse tensor cores want the groups along. Ties go to the earlier position.
    """
    groups = _groups(W).abs()
    return _keep(groups.topk(KEPT, dim=-1, sorted=False).indices, groups.shape).reshape(W.shape)


def random_2_4_mask(W: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """True at two positions drawn at random (independently of the values) in each group of 4 of ``W``'s rows."""
    groups = _groups(W)
    scores = torch.rand(groups.shape, generator=generator, device="cpu").to(W.device)
    return _keep(scores.topk(KEPT, dim=-1, sorted=False).indices, groups.shape).reshape(W.shape)


def magnitude_mask(W: torch.Tensor, sparsity: float = 0.5) -> torch.Tensor:
    """Unstructured magnitude pruning: True at the largest ``1 - sparsity`` share of |w| over the whole of ``W``,
    wherever they are (exactly round(numel x (1 - sparsity)) values)."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity: the share of weights set to zero, in [0, 1); got {sparsity!r}")
    keep = round(W.numel() * (1 - sparsity))
    mask = torch.zeros(W.numel(), dtype=torch.bool, device=W.device)
    mask[W.detach().abs().flatten().topk(keep, sorted=False).indices] = True
    return mask.reshape(W.shape)


def prune_2_4(W: torch.Tensor) -> torch.Tensor:
    """``W`` with all but the two largest |w| of each group of 4 set to zero (:func:`magnitude_2_4_mask`)."""
    return torch.where(magnitude_2_4_mask(W), W, torch.zeros((), dtype=W.dtype, device=W.device))  # +0, not -0


def nonzeros_per_group(W: torch.Tensor) -> torch.Tensor:
    """How many nonzeros each group of 4 of ``W``'s rows holds (rows x groups)."""
    return (_groups(W) != 0).sum(dim=-1)


def is_2_4(W: torch.Tensor) -> bool:
    """True if every group of 4 consecutive values of each row of ``W`` holds at most 2 nonzeros."""
    return bool((nonzeros_per_group(W) <= KEPT).all())


# ---------------------------------------------------------------------------------------------
# Compress and decompress


@dataclass(frozen=True)
class Compressed:
    """A 2:4 matrix in compressed form: the kept values and, for each, its position in its group.

    ``values`` and ``indices`` are both rows x columns/2: group g of row r keeps ``values[r, 2g:2g+2]``,
    which sat at columns ``4g + indices[r, 2g:2g+2]`` (ascending) of the dense matrix. ``indices`` are
    small integers 0..3 here; :meth:`metadata` packs them into the 2 bits each that the hardware stores.
    (cuSPARSELt and CUTLASS store the same information, reordered to suit their kernels.)
    """

    values: torch.Tensor
    indices: torch.Tensor
    shape: tuple[int, int]

    def metadata(self) -> torch.Tensor:
        """The indices packed 2 bits each, four to a byte (:func:`pack_indices`)."""
        return pack_indices(self.indices)

    @property
    def nbytes(self) -> int:
        """Bytes of the values and of the packed metadata."""
        return self.values.numel() * self.values.element_size() + self.metadata().numel()

    @property
    def dense_nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.values.element_size()


def compress(W: torch.Tensor) -> Compressed:
    """``W`` (2:4 along its rows) as its kept values and their positions in each group.

    A group with fewer than two nonzeros keeps a zero in its first free position, as the format always stores
    two values per group. Raises ValueError naming the first group with more than two nonzeros.
    """
    groups = _groups(W)
    nonzero = groups != 0
    counts = nonzero.sum(dim=-1)
    if (counts > KEPT).any():
        row, group = (int(i) for i in (counts > KEPT).nonzero()[0])
        raise ValueError(f"W: group {group} of row {row} (columns {GROUP * group}..{GROUP * group + 3}) holds "
                         f"{int(counts[row, group])} nonzeros; prune W to 2:4 first (prune_2_4)")
    position = torch.arange(GROUP, device=W.device)
    score = nonzero.to(torch.int64) * GROUP - position  # nonzeros first, then the earliest positions
    indices = score.topk(KEPT, dim=-1).indices.sort(dim=-1).values
    values = groups.gather(-1, indices)
    rows = W.shape[0]
    return Compressed(values.reshape(rows, -1), indices.reshape(rows, -1).to(torch.uint8), tuple(W.shape))


def decompress(compressed: Compressed) -> torch.Tensor:
    """The dense matrix of ``compressed``: every value put back at its position, zeros elsewhere."""
    rows, columns = compressed.shape
    values = compressed.values.reshape(rows, columns // GROUP, KEPT)
    indices = compressed.indices.reshape(rows, columns // GROUP, KEPT).to(torch.int64)
    dense = torch.zeros(rows, columns // GROUP, GROUP, dtype=values.dtype, device=values.device)
    return dense.scatter_(-1, indices, values).reshape(rows, columns)


def pack_indices(indices: torch.Tensor) -> torch.Tensor:
    """2-bit indices (integers 0..3, any shape ending in k) packed four to a byte: rows x ceil(k / 4) uint8.

    Index i of a row goes to bits 2(i mod 4) and up of byte i // 4, so one byte holds the metadata of two
    groups. A row whose k is not a multiple of 4 is padded with zeros.
    """
    if indices.numel() and (indices.min() < 0 or indices.max() > 3):
        raise ValueError("indices: 2-bit indices lie in 0..3")
    flat = indices.reshape(-1, indices.shape[-1]).to(torch.uint8)
    flat = F.pad(flat, (0, -flat.shape[1] % 4))
    quads = flat.reshape(flat.shape[0], -1, 4)
    packed = quads[..., 0] | quads[..., 1] << 2 | quads[..., 2] << 4 | quads[..., 3] << 6
    return packed.reshape(*indices.shape[:-1], -1)


def unpack_indices(packed: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` 2-bit indices of each row of ``packed`` (:func:`pack_indices` undone)."""
    count = positive_int("count", count)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=packed.device)
    quads = (packed.unsqueeze(-1) >> shifts) & 3
    return quads.reshape(*packed.shape[:-1], -1)[..., :count]


def pattern_figure(dense: torch.Tensor, pruned: torch.Tensor, *, title: str) -> go.Figure:
    """Three heatmaps side by side: a small matrix, the same matrix pruned to 2:4 (pruned weights blank), and its
    compressed values, each labelled with its position in its group; dotted lines part the groups of 4."""
    packed = compress(pruned)
    rows, columns = dense.shape
    limit = dense.abs().max().item()
    panels = [("dense", dense, [[f"{v:.1f}" for v in row] for row in dense.tolist()]),
              ("pruned to 2:4", torch.where(pruned != 0, pruned, torch.nan),
               [[f"{v:.1f}" if v else "" for v in row] for row in pruned.tolist()]),
              ("compressed: values (index in group)", packed.values,
               [[f"{v:.1f} ({i})" for v, i in zip(vr, ir, strict=True)]
                for vr, ir in zip(packed.values.tolist(), packed.indices.tolist(), strict=True)])]
    fig = make_subplots(rows=1, cols=3, column_widths=[columns, columns, columns / 2],
                        subplot_titles=[name for name, _, _ in panels], horizontal_spacing=0.04)
    for col, (_, matrix, text) in enumerate(panels, start=1):
        fig.add_trace(go.Heatmap(z=matrix.tolist(), text=text, texttemplate="%{text}", textfont=dict(size=9),
                                 colorscale="RdBu", zmid=0, zmin=-limit, zmax=limit, showscale=col == 1,
                                 colorbar=dict(title=dict(text="value")), xgap=1, ygap=1, hoverinfo="text"),
                      row=1, col=col)
        width = matrix.shape[1]
        step = GROUP if col < 3 else KEPT  # a group is 4 columns dense, 2 compressed
        for x in range(step, width, step):
            fig.add_vline(x=x - 0.5, line_dash="dot", line_color="#444444", row=1, col=col)
        fig.update_xaxes(title_text="column (reduction dimension)" if col < 3 else "compressed column", row=1, col=col,
                         showgrid=False)
        fig.update_yaxes(autorange="reversed", showticklabels=col == 1, showgrid=False, row=1, col=col)
    fig.update_yaxes(title_text="row", row=1, col=1)
    fig.update_layout(title=title, height=140 + 32 * rows, plot_bgcolor="#f4f4f4")
    return fig


# ---------------------------------------------------------------------------------------------
# Pruning a trained network


def _masked(W: torch.Tensor, method: str, generator: torch.Generator) -> torch.Tensor:
    if method == "2:4 magnitude":
        return magnitude_2_4_mask(W)
    if method == "2:4 random":
        return random_2_4_mask(W, generator)
    return magnitude_mask(W, 0.5)


PRUNING_METHODS = ("2:4 magnitude", "2:4 random", "unstructured 50% magnitude")
DENSE = "dense"


def linear_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The ``nn.Linear`` layers of ``model``, in order."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def train_with_masks(model: torch.nn.Module, data: dict[str, torch.Tensor], *, epochs: int, batch: int,
                     learning_rate: float, seed: int, masks: Sequence[torch.Tensor] = ()) -> None:
    """Train ``model`` in place with SGD and momentum on ``data`` (X_train, y_train of
    :func:`gpulab.mlp.load_digits_split`), shuffled by ``seed``. With ``masks`` (one boolean mask per linear layer,
    in order), the pruned weights stay zero: the gradients are masked before each step and the weights after
    it, as ASP does."""
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    X, y = data["X_train"], data["y_train"]
    layers = linear_layers(model)
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch):
            rows = order[start:start + batch]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(X[rows]), y[rows]).backward()
            if masks:
                for layer, mask in zip(layers, masks, strict=True):
                    layer.weight.grad.mul_(mask)
            optimizer.step()
            if masks:
                with torch.no_grad():
                    for layer, mask in zip(layers, masks, strict=True):
                        layer.weight.mul_(mask)


@torch.no_grad()
def _accuracy(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    return (model(X).argmax(dim=1) == y).double().mean().item()


def _check_pruned(model: torch.nn.Module, masks: Sequence[torch.Tensor], method: str, X: torch.Tensor) -> None:
    """Raise unless every pruned weight is still zero; for 2:4, unless every layer is 2:4 and the network computes
    the same with each weight passed through :func:`compress` and :func:`decompress`."""
    for i, (layer, mask) in enumerate(zip(linear_layers(model), masks, strict=True), start=1):
        if (layer.weight[~mask] != 0).any():
            raise AssertionError(f"{method}: layer {i} has nonzero weights where the mask pruned them")
        if method.startswith("2:4") and not is_2_4(layer.weight):
            raise AssertionError(f"{method}: layer {i} is not 2:4 after fine-tuning")
    if method.startswith("2:4"):
        rebuilt = copy.deepcopy(model)
        with torch.no_grad():
            for layer in linear_layers(rebuilt):
                layer.weight.copy_(decompress(compress(layer.weight)))
            check_close(rebuilt(X), model(X), 0.0, f"{method}: the network through compress/decompress")


@contextmanager
def _one_thread() -> Iterator[None]:
    """Within the block, torch computes on one CPU thread: for matrices of a few thousand elements, more threads
    only add synchronisation (three times slower on two cores)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def pruning_accuracy(hidden: Sequence[int] = (64, 64), *, epochs: int = 30, finetune_epochs: int = 30,
                     seeds: Sequence[int] = (0, 1, 2), batch: int = 64, learning_rate: float = 0.05) -> list[dict]:
    """Train an MLP (64 pixels -> ``hidden`` -> 10 digits) on scikit-learn's digits, then prune every linear layer
    each way of :data:`PRUNING_METHODS` and fine-tune for ``finetune_epochs`` with the mask fixed.

    A row per seed, method and stage ('trained', 'pruned', 'fine-tuned'): the test accuracy, the share of
    weights that are zero, and the share of the weights' squared norm the mask kept. The dense network is
    also trained for ``finetune_epochs`` more ('fine-tuned'), so that the extra epochs alone can be told
    apart from recovering what pruning lost. Before its accuracy counts, every fine-tuned network is
    checked: pruned weights still zero, 2:4 layers still 2:4 and unchanged by compress/decompress.
    Runs on the CPU: the network is too small for a GPU to help.
    """
    hidden = positive_ints("hidden", hidden) if len(hidden) else []
    bad = [h for h in hidden if h % GROUP]
    if bad:
        raise ValueError(f"hidden: every layer's input size must be a multiple of {GROUP} (the groups of 2:4), "
                         f"got {bad}")
    epochs, batch = positive_int("epochs", epochs), positive_int("batch", batch)
    finetune_epochs = positive_int("finetune_epochs", finetune_epochs)
    if not learning_rate > 0:
        raise ValueError(f"learning_rate: must be > 0, got {learning_rate!r}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    data = mlp.load_digits_split(seed=0)  # the same split for every seed: the seeds vary the weights and batches
    sizes = [data["X_train"].shape[1], *hidden, 10]
    rows = []
    with _one_thread():
        for seed in seeds:
            rows += _prune_one_seed(seed, sizes, data, epochs=epochs, finetune_epochs=finetune_epochs, batch=batch,
                                    learning_rate=learning_rate)
    return rows


def _row(seed: int, method: str, stage: str, model: torch.nn.Module, data: dict[str, torch.Tensor],
         kept_norm: float = 1.0) -> dict:
    """One row of :func:`pruning_accuracy`: ``model``'s test accuracy and its share of zero weights."""
    weights = torch.cat([layer.weight.detach().flatten() for layer in linear_layers(model)])
    return {"seed": seed, "method": method, "stage": stage,
            "test_accuracy": _accuracy(model, data["X_test"], data["y_test"]),
            "zeros": (weights == 0).double().mean().item(), "kept_norm": kept_norm,
            "test_samples": len(data["y_test"])}


def _prune_one_seed(seed: int, sizes: list[int], data: dict[str, torch.Tensor], *, epochs: int, finetune_epochs: int,
                    batch: int, learning_rate: float) -> list[dict]:
    """The rows of :func:`pruning_accuracy` for one seed."""
    train = dict(batch=batch, learning_rate=learning_rate)
    model = mlp.torch_mlp(sizes, seed=seed)
    train_with_masks(model, data, epochs=epochs, seed=seed, **train)
    longer = copy.deepcopy(model)
    # the dense network trained as long again, on the same batches as the fine-tuning of the pruned ones
    train_with_masks(longer, data, epochs=finetune_epochs, seed=seed + 1000, **train)
    rows = [_row(seed, DENSE, "trained", model, data), _row(seed, DENSE, "fine-tuned", longer, data)]
    generator = torch.Generator().manual_seed(seed)
    for method in PRUNING_METHODS:
        pruned = copy.deepcopy(model)
        layers = linear_layers(pruned)
        masks = [_masked(layer.weight.detach(), method, generator) for layer in layers]
        with torch.no_grad():
            total = sum(layer.weight.square().sum() for layer in layers)
            for layer, mask in zip(layers, masks, strict=True):
                layer.weight.mul_(mask)
            kept_norm = (sum(layer.weight.square().sum() for layer in layers) / total).item()
        rows.append(_row(seed, method, "pruned", pruned, data, kept_norm))
        train_with_masks(pruned, data, epochs=finetune_epochs, seed=seed + 1000, masks=masks, **train)
        _check_pruned(pruned, masks, method, data["X_test"])
        rows.append(_row(seed, method, "fine-tuned", pruned, data, kept_norm))
    return rows


def summarize_pruning(rows: Sequence[dict]) -> list[dict]:
    """Per method and stage, over the seeds: the mean, standard deviation, lowest and highest test accuracy, the
    mean share of zero weights and of the kept squared norm; and the gap to the dense network (after pruning:
    to the network as trained; after fine-tuning: to the dense network trained as many epochs more).

    The gap is judged seed by seed (paired): each pruned network is compared with the dense network of its
    own seed on the same test images, so the noise is the standard error of those per-seed differences.
    'within_noise' is True where the mean gap is at most twice that; None with a single seed.
    """
    groups: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["stage"]), {})[r["seed"]] = r
    reference = {"pruned": groups.get((DENSE, "trained"), {}), "fine-tuned": groups.get((DENSE, "fine-tuned"), {})}
    summary = []
    for (method, stage), by_seed in groups.items():
        accuracies = [r["test_accuracy"] for r in by_seed.values()]
        entry = {"method": method, "stage": stage, "runs": len(accuracies),
                 "accuracy_mean": statistics.fmean(accuracies),
                 "accuracy_sd": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                 "accuracy_min": min(accuracies), "accuracy_max": max(accuracies),
                 "zeros": statistics.fmean(r["zeros"] for r in by_seed.values()),
                 "kept_norm": statistics.fmean(r["kept_norm"] for r in by_seed.values())}
        base = reference.get(stage, {}) if method != DENSE else {}
        differences = [r["test_accuracy"] - base[seed]["test_accuracy"] for seed, r in by_seed.items() if seed in base]
        if differences:
            noise = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else None
            entry.update(gap_to_dense=statistics.fmean(differences), noise=noise,
                         within_noise=None if noise is None else abs(statistics.fmean(differences)) <= 2 * noise)
        summary.append(entry)
    return summary


def accuracy_figure(summary: Sequence[dict], *, title: str) -> go.Figure:
    """Test accuracy (mean over seeds, a bar of one standard deviation) of each method after pruning and after
    fine-tuning with the mask fixed, as grouped bars; a dotted line at the dense network's accuracy."""
    stages = {"pruned": "after pruning", "fine-tuned": "after fine-tuning (mask fixed)"}
    methods = list(dict.fromkeys(s["method"] for s in summary))
    fig = go.Figure()
    for i, (stage, label) in enumerate(stages.items()):
        chosen = {s["method"]: s for s in summary if s["stage"] == stage}
        shown = [m for m in methods if m in chosen]
        fig.add_trace(go.Bar(
            x=shown, y=[100 * chosen[m]["accuracy_mean"] for m in shown], name=label,
            error_y=dict(type="data", array=[100 * chosen[m]["accuracy_sd"] for m in shown]),
            marker_color=plots.PALETTE[i], marker_pattern_shape=plots.PATTERNS[i],
            text=[f"{100 * chosen[m]['accuracy_mean']:.1f}" for m in shown], textposition="outside",
            hovertext=[plots.hover_text(chosen[m], ("runs", "accuracy_min", "accuracy_max", "zeros", "kept_norm"))
                       for m in shown], hoverinfo="text"))
    dense = next((s for s in summary if s["method"] == DENSE and s["stage"] == "trained"), None)
    if dense:
        fig.add_hline(y=100 * dense["accuracy_mean"], line_dash="dot", line_color="#444444",
                      annotation_text="dense, trained", annotation_position="bottom left")
    fig.update_layout(title=title, barmode="group", yaxis_title="test accuracy (%), mean and sd over seeds",
                      xaxis_title="how the network was pruned", legend=dict(orientation="h", y=-0.2))
    return fig


# ---------------------------------------------------------------------------------------------
# The sparse tensor cores: peaks

SPARSE_MATH_FACTOR = 2  # a sparse tensor core skips the zero half of A: twice the dense FMA per clock
SPARSE_TENSOR_CORES_FROM = (8, 0)  # Ampere


def _capability(row: specs.GPU) -> tuple[int, int]:
    major, minor = row.compute_capability.split(".")
    return int(major), int(minor)


def sparse_peak(row: specs.GPU, precision: str) -> specs.Peak:
    """The 2:4 sparse tensor-core peak of ``row`` in ``precision``: the dense peak of :func:`gpulab.specs.peak`
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


# ---------------------------------------------------------------------------------------------
# The sparse tensor cores through torch.sparse: sparse x dense against dense x dense

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


def speedup_figure(rows: Sequence[dict], *, title: str) -> go.Figure:
    """Speed-up of each 2:4 backend over the dense product against tokens (log), a panel per dtype, one line per
    weight size and backend; dotted lines at 1 (no gain) and at 2 (the sparse tensor cores' peak ratio)."""
    ok = [r for r in rows if r.get("status") == "ok" and "speedup" in r]
    dtypes = list(dict.fromkeys(r["dtype"] for r in ok)) or ["(none)"]
    fig = make_subplots(rows=1, cols=len(dtypes), subplot_titles=dtypes, shared_yaxes=True)
    sizes = sorted({r["n"] for r in ok})
    dashes = {b: d for b, d in zip(BACKENDS, ("solid", "dash"), strict=True)}
    for col, dtype in enumerate(dtypes, start=1):
        for i, n in enumerate(sizes):
            for backend in BACKENDS:
                line = sorted((r for r in ok if r["dtype"] == dtype and r["n"] == n and r["backend"] == backend),
                              key=lambda r: r["tokens"])
                if not line:
                    continue
                fig.add_trace(go.Scatter(
                    x=[r["tokens"] for r in line], y=[r["speedup"] for r in line], mode="lines+markers",
                    name=f"{n:,} x {n:,}, {backend}", legendgroup=f"{n}{backend}", showlegend=col == 1,
                    line=dict(color=plots.PALETTE[i % len(plots.PALETTE)], dash=dashes[backend]),
                    marker=dict(symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)]),
                    hovertext=[plots.hover_text(r, ("n", "tokens", "backend", "seconds", "tflops", "speedup"))
                               for r in line], hoverinfo="text"), row=1, col=col)
        for level, text in ((1, "dense"), (SPARSE_MATH_FACTOR, "2x: the sparse peak ratio")):
            fig.add_hline(y=level, line_dash="dot", line_color="#444444", annotation_text=text,
                          annotation_position="top left", row=1, col=col)
        fig.update_xaxes(type="log", title_text="tokens (rows of X)", row=1, col=col)
    fig.update_yaxes(title_text="speed-up over dense (dense time / sparse time)", row=1, col=1)
    fig.update_layout(title=title, legend=dict(title=dict(text="weight, backend")))
    return fig


def rate_figure(rows: Sequence[dict], n: int, *, title: str, peaks: Mapping[str, float] | None = None) -> go.Figure:
    """TFLOP/s (dense FLOP count) of the dense product and of each backend against tokens, for the n x n weight,
    a line per dtype and backend; ``peaks`` ({label: TFLOP/s}) are drawn as dotted lines."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("n") == n]
    fig = go.Figure()
    combos = list(dict.fromkeys((r["dtype"], r["backend"]) for r in ok))
    for i, (dtype, backend) in enumerate(combos):
        line = sorted((r for r in ok if r["dtype"] == dtype and r["backend"] == backend), key=lambda r: r["tokens"])
        fig.add_trace(go.Scatter(
            x=[r["tokens"] for r in line], y=[r["tflops"] for r in line], mode="lines+markers",
            name=f"{dtype}, {backend}", line=dict(color=plots.PALETTE[i % len(plots.PALETTE)],
                                                  dash="solid" if backend == DENSE_BACKEND else "dash"),
            marker=dict(symbol=plots.SYMBOLS[i % len(plots.SYMBOLS)]),
            hovertext=[plots.hover_text(r, ("tokens", "seconds", "tflops", "relative_error")) for r in line],
            hoverinfo="text"))
    for label, value in (peaks or {}).items():
        fig.add_hline(y=value, line_dash="dot", line_color="#444444", annotation_text=label,
                      annotation_position="top left")
    fig.update_layout(title=title, xaxis_title="tokens (rows of X)",
                      yaxis_title="TFLOP/s (dense FLOP: 2 x tokens x n^2)")
    fig.update_xaxes(type="log")
    return fig


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
