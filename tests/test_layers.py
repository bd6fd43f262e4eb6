"""The library's layout follows the book: a core, the kernels, one package per chapter, the labs' graders.

- ``gpulab.core`` imports nothing of gpulab above it;
- ``gpulab.kernels`` imports the core;
- a chapter package ``gpulab.chNN_topic`` imports the core, the kernels, itself and earlier chapters;
- ``gpulab.labs.grading`` and ``gpulab.labs.kernel_grading`` (the framework) import the core, the kernels and the
  chapters; a lab's grader imports those, the framework and its own package;
- ``gpulab.course`` (the book as a course: every chapter's plan and times) imports the core and the chapters, and
  nothing imports it;
- nothing imports a chapter's explorer, and nothing outside a lab's package imports its grader;
- no import cycle, no module over 500 lines, and a chapter package for every chapter notebook (and no other).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "src" / "gpulab"
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = ["gpulab", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
FRAMEWORK = ("grading", "kernel_grading")  # gpulab.labs' grading framework, which every lab's grader may use


def imports(path: Path) -> set[str]:
    """The gpulab modules ``path`` imports, anywhere in it (a function's own imports count too)."""
    found = set()
    name = module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "gpulab"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                source = ".".join([*base[: len(base) - node.level + 1], *filter(None, [node.module])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "gpulab":
                continue
            for alias in node.names:  # `from gpulab.core import timing` imports the module gpulab.core.timing
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source)
    return found - {name}


GRAPH = {name: imports(path) for name, path in MODULES.items()}


def layer(module: str) -> tuple[str, int | str]:
    """('core' | 'kernels' | 'chapter' | 'grading' | 'lab' | 'course' | 'root', the chapter's number or the lab's
    package)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "root", 0
    if parts[1] == "course":
        return "course", 0
    if parts[1] in ("core", "kernels"):
        return parts[1], 0
    if chapter := re.fullmatch(r"ch(\d\d)_\w+", parts[1]):
        return "chapter", int(chapter.group(1))
    if parts[1] == "labs":
        if len(parts) == 2 or parts[2] in FRAMEWORK:
            return "grading", 0
        return "lab", ".".join(parts[:3])
    raise AssertionError(f"{module}: not in any layer (core, kernels, chNN_topic, labs, course)")


def allowed(importer: str, imported: str) -> bool:
    (kind, which), (target, number) = layer(importer), layer(imported)
    if imported == "gpulab":
        return kind != "core"  # the package's own constants (SRC), but the core stands alone
    if target == "root" or imported.endswith(".explorer"):
        return False
    below = {"root": (), "core": ("core",), "kernels": ("core", "kernels"), "chapter": ("core", "kernels"),
             "grading": ("core", "kernels", "chapter", "grading"), "lab": ("core", "kernels", "chapter", "grading"),
             "course": ("core", "kernels", "chapter")}
    if target in below[kind]:
        return True
    if kind == target == "chapter":
        return number <= which  # earlier chapters, or its own package
    return kind == target == "lab" and number == which  # its own package


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_layers(module):
    wrong = sorted(m for m in GRAPH[module] if not allowed(module, m))
    assert not wrong, f"{module} ({layer(module)[0]}) must not import {wrong}"


def test_no_import_cycle():
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(GRAPH.get(module, ())):
            if state.get(imported) == "open":
                cycle = path[path.index(imported):] + [imported] if imported in path else [module, imported]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if imported not in state:
                visit(imported, [*path, imported])
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_500_lines(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)}: {lines} lines; split it by job"


def test_a_chapter_package_for_every_chapter_notebook():
    chapters = {path.stem for path in (ROOT / "notebooks").glob("*.ipynb")}
    packages = {path.name[2:] for path in PACKAGE.glob("ch[0-9][0-9]_*") if path.is_dir()}
    assert packages == chapters, f"notebooks without a package: {chapters - packages}; packages without a " \
                                 f"notebook: {packages - chapters}"
    for stem in chapters:
        docstring = ast.get_docstring(ast.parse((PACKAGE / f"ch{stem}" / "__init__.py").read_text())) or ""
        assert f"notebooks/{stem}.ipynb" in docstring, f"gpulab.ch{stem}'s docstring names its notebook"


def test_the_layer_rules_catch_a_wrong_import():
    assert not allowed("gpulab.core.timing", "gpulab.ch03_blas_levels.blas")  # the core above nothing
    assert not allowed("gpulab.ch03_blas_levels.blas", "gpulab.ch04_mlp_gemms.mlp")  # a later chapter
    assert not allowed("gpulab.ch09_gemm_on_the_gpu.gemm", "gpulab.ch04_mlp_gemms.explorer")  # an explorer
    assert not allowed("gpulab.labs.lab10_fuse_it.diagnose", "gpulab.labs.lab11_all_reduce.ring")  # another lab
    assert not allowed("gpulab.ch16_distributed_training.ddp", "gpulab.labs.grading")  # a grader
    assert not allowed("gpulab.ch03_blas_levels.blas", "gpulab.course")  # the course is above every chapter
    assert allowed("gpulab.course", "gpulab.ch03_blas_levels.plan")
    assert allowed("gpulab.ch09_gemm_on_the_gpu.gemm", "gpulab.ch04_mlp_gemms.waves")
    assert allowed("gpulab.labs.lab11_all_reduce.diagnose", "gpulab.labs.lab11_all_reduce.ring")
