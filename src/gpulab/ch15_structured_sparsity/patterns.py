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
  :func:`.pruning.pruning_accuracy` trains an MLP on scikit-learn's digits, prunes it each way and fine-tunes it with
  the mask fixed (the recipe of NVIDIA's ASP: train dense, prune 2:4, retrain);
- the hardware: :func:`.speedup.sparse_peak` is a GPU's 2:4 peak (twice its dense tensor-core peak of
  :mod:`gpulab.core.specs`), and :func:`.speedup.linear_speedup` times ``torch.sparse.to_sparse_semi_structured``
  weights in ``F.linear`` against the dense product with the same pruned weights, through both of torch's backends
  (cuSPARSELt and CUTLASS), every result first checked against float64, and :func:`.speedup.speedup_statements` says
  what its rows show. :func:`.speedup.orientations` tries the products torch does and does not support with a sparse
  operand.

Without an NVIDIA GPU of compute capability 8.0 or later the GPU experiments return rows whose status
says why, and the format and pruning work runs anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpulab.core.validation import positive_int

GROUP, KEPT = 4, 2  # at most KEPT nonzeros in every GROUP consecutive values along the reduction dimension





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






@dataclass(frozen=True)
class Compressed:
    """A 2:4 matrix in compressed form: the kept values and, for each, its position in its group.

    ``values`` and ``indices`` are both rows x columns/2: group g of row r keeps ``values[r, 2g:2g+2]``,
    which sat at columns ``4g + indices[r, 2g:2g+2]`` (ascending) of the dense matrix. ``indices`` are
    small integers 0..3 here; :meth:`Compressed.metadata` packs them into the 2 bits each that the hardware stores.
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
