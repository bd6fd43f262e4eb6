"""Correctness checks run before anything is timed: a fast wrong answer is worth nothing.

Checks raise (they never just print), NaN never passes, and outputs are poisoned with NaN before a
kernel writes them so that an element the kernel forgot to write is caught.
"""

from __future__ import annotations

import torch


def relative_error(actual: torch.Tensor, reference: torch.Tensor, scale: float | None = None) -> float:
    """||actual - reference|| / ||reference|| in float64 (Frobenius norm); NaN if anything is NaN.

    ``scale`` replaces ||reference|| where the reference can cancel to something small: for a dot
    product x.y the rounding error is bounded relative to |x|.|y|, not to |x.y|.
    """
    actual64 = actual.detach().to("cpu", torch.float64)
    reference64 = reference.detach().to("cpu", torch.float64)
    if actual64.shape != reference64.shape:
        raise ValueError(f"actual: shape {tuple(actual64.shape)} differs from reference {tuple(reference64.shape)}")
    if not torch.isfinite(actual64).all():
        return float("nan")
    norm = scale if scale is not None else torch.linalg.vector_norm(reference64).item()
    return torch.linalg.vector_norm(actual64 - reference64).item() / (norm or 1.0)


def check_close(actual: torch.Tensor, reference: torch.Tensor, tolerance: float, what: str,
                scale: float | None = None) -> float:
    """Return the relative error of ``actual``; raise AssertionError if it is NaN or above ``tolerance``."""
    error = relative_error(actual, reference, scale)
    if not error <= tolerance:  # written this way so that NaN fails
        raise AssertionError(f"{what}: relative error {error:.3g} exceeds {tolerance:.1g}")
    return error


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output buffer full of NaN: any element a kernel fails to write fails the check."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, generator=None) -> torch.Tensor:
    """Fresh standard-normal data (never zeros: zeros hide wrong indexing and can run faster)."""
    return torch.randn(shape, dtype=torch.float32, device=device, generator=generator).to(dtype)
