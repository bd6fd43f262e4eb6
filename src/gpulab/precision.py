"""How PyTorch is told which arithmetic a float32 matrix multiply may use.

'float32' means true single precision on the CUDA cores; 'tf32' lets the tensor cores round the
inputs to 10 mantissa bits (Ampere and later). Other dtypes are unaffected by the switch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from gpulab.validation import dtype_name


@contextmanager
def matmul_mode(dtype: str | torch.dtype) -> Iterator[torch.dtype]:
    """Within the block, float32 matmuls use TF32 if and only if ``dtype == 'tf32'``; yields the torch dtype."""
    name = dtype_name(dtype)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    try:
        yield torch.float32 if name == "tf32" else getattr(torch, name)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


# Relative error a correct matmul of random normal data stays under, per arithmetic (against float64).
MATMUL_TOLERANCE = {"float64": 1e-12, "float32": 1e-4, "tf32": 5e-3, "float16": 1e-2, "bfloat16": 5e-2}
