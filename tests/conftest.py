"""Shared fixtures: the repository root and the built book."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILT_HTML = ROOT / "_build" / "html"


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
