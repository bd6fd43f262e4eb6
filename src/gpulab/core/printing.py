"""What the chapters show besides figures and tables: the source of a gpulab function, what a measurement says in
a sentence or two (:func:`say`, which wraps to the text column like the prose around it), a byte count."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from IPython.display import Code, display

_BINARY_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def show_source(fn: Callable) -> None:
    """Display the source of ``fn`` with syntax highlighting: the code the text describes, not a copy of it.

    A numba kernel shows the Python function it was compiled from (its ``py_func``).
    """
    display(Code(inspect.getsource(getattr(fn, "py_func", fn)), language="python"))


class Sentences:
    """Lines of Markdown: paragraphs on the page (they wrap to the text column), plain lines in a terminal."""

    def __init__(self, lines: tuple[str, ...]):
        self.lines = lines

    def _repr_markdown_(self) -> str:
        return "\n\n".join(self.lines)

    def __repr__(self) -> str:
        return "\n".join(self.lines)


def say(*lines: str) -> None:
    """Display ``lines`` (Markdown) as paragraphs: what a measurement says, printed from the run that made it."""
    display(Sentences(tuple(lines)))


def format_bytes(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps the number at least 1, e.g. ``"1.5 MiB"``."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    for unit, scale in _BINARY_UNITS:
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes} B"
