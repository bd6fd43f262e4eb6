"""Shared fixtures and helpers: the repository root, the built book, ``needs_gpu``, what an explorer shows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpulab.core import kernel_mode

ROOT = Path(__file__).resolve().parents[1]
BUILT_HTML = ROOT / "_build" / "html"


def needs_gpu(test=None, *, gpus: int = 1, capability: tuple[int, int] = (0, 0)):
    """Mark a test that needs CUDA GPUs whose kernels run for real (``kernel_mode.on_gpu()``): ``gpus`` of them, of
    at least compute ``capability``. Elsewhere it is skipped with the reason; ``make gpu-run`` runs every such
    test (``pytest -m gpu``) and reports them. Use as ``@needs_gpu`` or ``@needs_gpu(gpus=2)``."""
    def mark(function):
        if not kernel_mode.on_gpu():
            reason = "needs a CUDA GPU" if gpus == 1 else f"needs {gpus} CUDA GPUs"
        elif torch.cuda.device_count() < gpus:
            reason = f"needs {gpus} CUDA GPUs; this machine has {torch.cuda.device_count()}"
        elif torch.cuda.get_device_capability() < capability:
            reason = f"needs a GPU of compute capability {capability[0]}.{capability[1]} or later"
        else:
            reason = None
        return pytest.mark.gpu(pytest.mark.skipif(reason is not None, reason=reason or "")(function))
    return mark(test) if test is not None else mark


def shown(output) -> tuple[str, list[dict]]:
    """What an explorer's ``Output`` widget shows: its text (paragraphs and tables, as plain text) and the plotly
    figures it displays. The results must be set as its state, never captured (see gpulab.core.widgets)."""
    assert output.msg_id == ""
    text, figures = [], []
    for o in output.outputs:
        data = o.get("data", {})
        if "application/vnd.plotly.v1+json" in data:
            figures.append(data["application/vnd.plotly.v1+json"])
        else:
            text.append(o.get("text") or data.get("text/plain", ""))
    return "\n".join(text), figures


@pytest.fixture(scope="session")
def built_book() -> Path:
    """The HTML of `make book`; the book stage of `make test` builds it before the page tests run."""
    if not (BUILT_HTML / "index.html").exists():
        pytest.fail("the book is not built: run `make book` (or `make test`, which builds it) first")
    return BUILT_HTML


def book_pages(html_root: Path) -> list[Path]:
    """Every page of the book, from the table of contents' rendered HTML files."""
    return sorted(p for p in html_root.rglob("*.html")
                  if not p.name.startswith(("genindex", "search")) and "_static" not in p.parts
                  and p.relative_to(html_root).as_posix() != "index.html")
