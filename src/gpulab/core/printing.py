"""What the chapters show besides figures and tables: the source of a gpulab function, what a measurement says in
a sentence or two (:func:`say`, which wraps to the text column like the prose around it), the worked answer to an
exercise, closed until the reader opens it (:func:`answer`), a byte count."""

from __future__ import annotations

import html
import inspect
import re
from collections.abc import Callable
from types import ModuleType

from IPython.display import Code, display

_BINARY_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


class Listing:
    """Source code with syntax highlighting, in a block that scrolls sideways inside the text column when a line is
    wider than it (as code on any documentation page does) rather than widening the page; plain text in a
    terminal."""

    def __init__(self, text: str, language: str):
        self.text, self.language = text, language

    def _repr_html_(self) -> str:
        return f'<div class="gpulab-listing">{Code(self.text, language=self.language)._repr_html_()}</div>'

    def __repr__(self) -> str:
        return self.text


def show_code(text: str, language: str) -> None:
    """Display ``text`` as a :class:`Listing` in ``language`` ('python', 'cuda')."""
    display(Listing(text, language))


def show_source(fn: Callable) -> None:
    """Display the source of ``fn`` with syntax highlighting: the code the text describes, not a copy of it.

    A numba kernel shows the Python function it was compiled from (its ``py_func``).
    """
    show_code(inspect.getsource(getattr(fn, "py_func", fn)), "python")


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


_EMPHASIS = ((re.compile(r"\*\*([^*]+)\*\*"), r"<strong>\1</strong>"),
             (re.compile(r"(?<![*\w])\*([^*\s][^*]*)\*(?![*\w])"), r"<em>\1</em>"))


def _inline_html(text: str) -> str:
    """A line of the Markdown the answers use (`code`, **bold**, *emphasis*) as HTML; code is left as written."""
    parts = re.split(r"`([^`]+)`", text)  # odd parts are code
    for i, part in enumerate(parts):
        part = html.escape(part, quote=False)
        if i % 2:
            parts[i] = f"<code>{part}</code>"
            continue
        for pattern, replacement in _EMPHASIS:
            part = pattern.sub(replacement, part)
        parts[i] = part
    return "".join(parts)


class Answer:
    """A worked answer: closed under its title until opened (an HTML ``<details>``, on the book's pages and in
    Jupyter or Colab alike); plain lines in a terminal. Lines are Markdown paragraphs; lines that start with '- '
    make a list."""

    def __init__(self, title: str, lines: tuple[str, ...]):
        if not lines:
            raise ValueError(f"answer {title!r}: no lines; an answer says something")
        self.title, self.lines = title, lines

    def _repr_html_(self) -> str:
        parts, items = [], []
        for line in (*self.lines, ""):
            if line.startswith("- "):
                items.append(f"<li>{_inline_html(line[2:])}</li>")
                continue
            if items:
                parts.append(f"<ul>{''.join(items)}</ul>")
                items = []
            if line:
                parts.append(f"<p>{_inline_html(line)}</p>")
        return (f'<details class="gpulab-answer"><summary>{_inline_html(self.title)}</summary>'
                f"{''.join(parts)}</details>")

    def __repr__(self) -> str:
        return "\n".join((self.title, *self.lines))


def answer(title: str, *lines: str) -> None:
    """Display the worked answer ``lines`` (Markdown) under ``title``, closed until the reader opens it."""
    display(Answer(title, lines))


def exercise_answers(module: ModuleType) -> list[Answer]:
    """The worked answers of a chapter's ``answers`` module: its functions ``exercise_1``, ``exercise_2``, ...
    (each returns an :class:`Answer`), in the order of the exercises."""
    found = {int(name.rpartition("_")[2]): fn for name, fn in vars(module).items()
             if re.fullmatch(r"exercise_\d+", name) and callable(fn)}
    if sorted(found) != list(range(1, len(found) + 1)):
        raise ValueError(f"{module.__name__}: exercise answers numbered {sorted(found)}, not 1 to {len(found)}")
    return [found[n]() for n in sorted(found)]


def show_answers(module: ModuleType) -> None:
    """Display every worked answer of a chapter's ``answers`` module, each closed until opened."""
    for shown in exercise_answers(module):
        display(shown)


def format_bytes(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that keeps the number at least 1, e.g. ``"1.5 MiB"``."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    for unit, scale in _BINARY_UNITS:
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes} B"
