"""Which code an experiment runs, and a fingerprint of exactly that code.

A recording is only as good as the code that made it: when that code changes, the recording may no
longer say what the page claims. So every recording carries a fingerprint of the code its experiment
runs, and the test suite reports a recording whose fingerprint no longer matches the code.

The fingerprint covers the *closure* of the experiment: the experiment function and every gpulab
function, class and constant it reaches, however many calls down and in whichever module, plus the
CUDA C files it compiles (named in that code as ``"NN_name"``). It is read from the source files, not
from the running program: each reached definition is parsed, its docstring and annotations are
dropped, every name that refers to another gpulab definition is replaced by that definition's bare
name (and a module named in a string, as in ``python -m gpulab.x``, by its last name), and the result
is hashed. So comments, docstrings and formatting do not count, an edit to a function the experiment
never reaches stales nothing, and moving a function to another module (or importing it another way)
keeps its hash. Kernel files count without their comments and blank lines.

What the source cannot show -- a function found by name at run time, the code a worker process runs --
the experiment declares with ``runs=`` (names looked up in its own module). Its ``version`` is raised by
its author when the meaning of the measurement changes while its code does not (a new unit, say).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpulab.core.closure import PACKAGE, PACKAGE_ROOT, Definition, Experiment, Source, _read_declaration, package_source

KERNEL_FOLDER = PACKAGE_ROOT / "kernels"
KERNEL_NAME = re.compile(r"(\d\d_\w+?)(?:\.cu)?")


def experiment(*names: str, version: int = 1, runs: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Declare a function as the experiment behind the recordings ``names``.

    ``runs``: names, in the function's module, of code it runs that its source does not show (a worker
    process's entry point, a callback looked up by name). Keep the arguments literal: the fingerprint
    reads them from the source.
    """
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"names: one or more recording names, got {names!r}")
    if not isinstance(version, int) or version < 1:
        raise ValueError(f"version: a positive int, got {version!r}")

    def declare(fn: Callable) -> Callable:
        fn.__experiment__ = Experiment(tuple(names), version, tuple(runs))
        return fn

    return declare


def declaration(fn: Callable) -> Experiment:
    """The ``@experiment`` declaration of ``fn``; a ValueError if it has none."""
    declared = getattr(fn, "__experiment__", None)
    if declared is None:
        raise ValueError(f"{fn.__module__}.{fn.__qualname__} is not an experiment: decorate it with "
                         "@experiment('recording_name') (gpulab.core.provenance) so that its recordings can be checked")
    return declared


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def kernel_text(path: Path) -> str:
    """A CUDA C file without its comments and blank lines, each line stripped: what the fingerprint counts."""
    code = re.sub(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/',
                  lambda m: m.group(0) if m.group(0).startswith('"') else " ", path.read_text(), flags=re.S)
    return "\n".join(line.strip() for line in code.splitlines() if line.strip())


@dataclass(frozen=True)
class Fingerprint:
    """The hash of an experiment's closure, and a hash per part (to say which part changed)."""

    hash: str
    version: int
    parts: dict[str, str]  # "gpulab.module.name" or "kernels/NN_name.cu" -> hash of that part

    def as_dict(self) -> dict:
        return {"hash": self.hash, "version": self.version, "parts": self.parts}


def _part_name(where: str) -> str:
    """The part's name without its module: what stays the same when a definition moves."""
    return where if where.startswith("kernels/") else where.rsplit(".", 1)[-1]


def fingerprint(module: str, name: str, source: Source | None = None) -> Fingerprint:
    """The fingerprint of the experiment ``module.name``: its closure of gpulab code and kernel files."""
    source = source or package_source()
    root = source.resolve(module, name)
    if not isinstance(root, Definition):
        raise ValueError(f"{module}.{name}: no such function in the gpulab source")
    declared = next(filter(None, map(_read_declaration, root.nodes)), None)
    version = declared.version if declared else 1
    pending = [root]
    for extra in declared.runs if declared else ():
        found = source.resolve(root.module, extra)
        if not isinstance(found, Definition):
            raise ValueError(f"{root.where}: runs={extra!r} names nothing in {root.module}")
        pending.append(found)
    texts: dict[str, str] = {}
    strings: set[str] = set()
    while pending:
        definition = pending.pop()
        if definition.where in texts:
            continue
        text, reached, named = source.normalized(definition)
        texts[definition.where] = text
        strings |= named
        pending.extend(found for found in reached if found.where not in texts)
    for text in sorted(strings):
        match = KERNEL_NAME.fullmatch(text)
        if match and (source.root / "kernels" / f"{match.group(1)}.cu").is_file():
            texts[f"kernels/{match.group(1)}.cu"] = kernel_text(source.root / "kernels" / f"{match.group(1)}.cu")
    parts = {where: _digest(text)[:12] for where, text in sorted(texts.items())}
    whole = "\n".join(sorted(f"{_part_name(where)} {_digest(text)}" for where, text in texts.items()))
    return Fingerprint(_digest(whole)[:16], version, parts)


def fingerprint_of(fn: Callable) -> Fingerprint:
    """The fingerprint of a gpulab function, from its module and name."""
    if not fn.__module__.split(".")[0] == PACKAGE or "." in fn.__qualname__:
        raise ValueError(f"{fn.__module__}.{fn.__qualname__}: an experiment is a top-level function of a "
                         "gpulab module, so that its code can be read from the package's source")
    return fingerprint(fn.__module__, fn.__qualname__)


def changes(recorded: dict, current: Fingerprint) -> list[str]:
    """What differs between a recording's fingerprint (its ``code`` provenance) and the code now, in words.
    A part found under another module with the same code has moved, which is no change."""
    if recorded.get("hash") == current.hash and recorded.get("version") == current.version:
        return []
    said = []
    if recorded.get("version") != current.version:
        said.append(f"version {recorded.get('version')} -> {current.version}")
    before = dict(recorded.get("parts", {}))
    # (name, digest) -> the places it was recorded at: several parts can share both (CONFIG = dict(OTHER_CONFIG) in
    # three modules), and each recorded one matches one current part
    unmatched_before: dict[tuple[str, str], list[str]] = {}
    for w, d in before.items():
        unmatched_before.setdefault((_part_name(w), d), []).append(w)
    changed_names = {_part_name(w) for w in before}
    for where, digest in current.parts.items():
        places = unmatched_before.get((_part_name(where), digest))
        if places:
            places.remove(where if where in places else places[0])
            continue  # the same code, perhaps in another module
        said.append(f"{where} changed" if _part_name(where) in changed_names else f"{where} is new")
    current_names = {_part_name(w) for w in current.parts}
    said += [f"{where} no longer runs" for (name, _), places in sorted(unmatched_before.items()) for where in places
             if name not in current_names]
    return said or ["the code changed"]
