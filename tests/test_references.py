"""Every name the library's docstrings and the book's pages point at exists where they say.

Docstrings point with Sphinx roles (:func:`measure`, :mod:`gpulab.core.timing`, :func:`.probe`); the pages and the
README with dotted names in backticks (`gpulab.core.timing.measure`). Both must follow the package's layout.
"""

from __future__ import annotations

import ast
import re

import nbformat
import pytest

from conftest import ROOT
from gpulab.core.closure import Definition, ModuleRef, Source

SOURCE = Source()
ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|exc):`~?([\w.]+)`")
DOTTED = re.compile(r"\bgpulab(?:\.\w+)+")
PAGES = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("labs/solutions/*.ipynb"), *ROOT.glob("book/*.md"),
                *ROOT.glob("book/*.ipynb"), ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "labs" / "README.md"])


def resolves(reference: str, module: str | None = None) -> bool:
    """Whether ``reference`` names a gpulab module, or a definition (or an attribute of a class) in one; a bare or
    relative (``.name``) reference is looked up from ``module``."""
    if reference.startswith("."):
        package = module if SOURCE.modules[module].is_package else module.rsplit(".", 1)[0]
        reference = f"{package}{reference}"
    parts = reference.split(".")
    if parts[0] != "gpulab":
        found = SOURCE.resolve(module, parts[0]) if module else None
        return found is not None and (len(parts) == 1 or isinstance(found, Definition | ModuleRef))
    for split in range(len(parts), 0, -1):
        head = ".".join(parts[:split])
        if head in SOURCE.modules:
            rest = parts[split:]
            if not rest:
                return True
            found = SOURCE.resolve(head, rest[0])
            return found is not None and (len(rest) == 1 or isinstance(found, Definition))
    return False


def docstrings(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            text = ast.get_docstring(node)
            if text:
                yield text


@pytest.mark.parametrize("module", sorted(SOURCE.modules))
def test_docstring_roles_point_at_what_exists(module):
    path = SOURCE.root.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    broken = sorted({reference for text in docstrings(ast.parse(path.read_text()))
                     for reference in ROLE.findall(text) if not resolves(reference, module)})
    assert not broken, f"{module}: its docstrings point at {broken}, which it neither defines nor imports"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_name_what_exists(page):
    if page.suffix == ".ipynb":
        text = "\n".join(cell.source for cell in nbformat.read(page, as_version=4).cells)
    else:
        text = page.read_text()
    broken = sorted({reference for reference in DOTTED.findall(text)
                     if "NN" not in reference and not resolves(reference)})  # chNN_topic: a pattern, not a name
    assert not broken, f"{page.relative_to(ROOT)} names {broken}"


def test_the_check_catches_what_moved():
    assert resolves("gpulab.core.timing.measure") and resolves("gpulab.core.recordings.Recording.label")
    assert not resolves("gpulab.timing.measure")  # where it was before the layout
    assert resolves("measure", "gpulab.core.timing") and not resolves("levels_sweep", "gpulab.core.timing")
    assert resolves(".probe", "gpulab.labs.lab08_train_with_amp.diagnose")
