"""The gpulab package read as source: where every name is defined, what each import refers to, which functions
are declared experiments, and each definition's code in a canonical form (docstrings and annotations dropped,
every reference to another gpulab definition replaced by that definition's bare name). :mod:`gpulab.core.provenance`
fingerprints an experiment's closure from it.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PACKAGE = "gpulab"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the gpulab package (this module is in gpulab/core)


DECORATOR = "experiment"


@dataclass(frozen=True)
class Experiment:
    """What ``@experiment`` declares about a function: the recordings it makes and how to fingerprint them."""

    names: tuple[str, ...]
    version: int
    runs: tuple[str, ...]


@dataclass(frozen=True)
class Definition:
    """A name bound at the top level of a gpulab module, with the statements that bind it."""

    module: str
    name: str
    nodes: tuple[ast.stmt, ...]

    @property
    def where(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class ModuleRef:
    module: str


@dataclass
class _Module:
    name: str
    is_package: bool
    definitions: dict[str, list[ast.stmt]]
    imports: dict[str, tuple[str, str | None]]  # local name -> (absolute module, name in it, or None for the module)


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = [PACKAGE, *path.relative_to(root).with_suffix("").parts]
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _top_level(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The module's statements, looking inside top-level if/try/with blocks (conditional definitions)."""
    for node in statements:
        if isinstance(node, ast.If | ast.With):
            yield from _top_level(node.body)
            yield from _top_level(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)
            yield from _top_level(node.finalbody)
        else:
            yield node


def _assigned_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _assigned_names(element)
    elif isinstance(target, ast.Starred):
        yield from _assigned_names(target.value)


def _absolute(module: _Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _read_module(path: Path, root: Path) -> _Module:
    name, is_package = _module_name(path, root)
    module = _Module(name, is_package, {}, {})
    for node in _top_level(ast.parse(path.read_text(), filename=str(path)).body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            module.definitions.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for bound in _assigned_names(target):
                    module.definitions.setdefault(bound, []).append(node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    if alias.asname:
                        module.imports[alias.asname] = (alias.name, None)
                    else:
                        module.imports[PACKAGE] = (PACKAGE, None)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            if source.split(".")[0] == PACKAGE:
                for alias in node.names:
                    module.imports[alias.asname or alias.name] = (source, alias.name)
    return module


class Source:
    """The parsed source of the gpulab package: where each name is defined, and what each import refers to."""

    def __init__(self, root: Path = PACKAGE_ROOT):
        self.root = root
        self.modules = {m.name: m for m in (_read_module(p, root) for p in sorted(root.rglob("*.py")))}
        self._normalized: dict[str, tuple[str, list[Definition], set[str]]] = {}

    def resolve(self, module: str, name: str) -> Definition | ModuleRef | None:
        """What ``name`` refers to at the top level of ``module``: a gpulab definition, a gpulab module, or
        None (a builtin, or something outside gpulab)."""
        for _ in range(50):  # an import chain longer than this is a cycle
            found = self.modules.get(module)
            if found is None:
                return None
            if name in found.definitions:
                return Definition(module, name, tuple(found.definitions[name]))
            if name in found.imports:
                source, imported = found.imports[name]
                if imported is None:
                    return ModuleRef(source) if source in self.modules else None
                if f"{source}.{imported}" in self.modules:
                    return ModuleRef(f"{source}.{imported}")
                module, name = source, imported
                continue
            if f"{module}.{name}" in self.modules and found.is_package:
                return ModuleRef(f"{module}.{name}")
            return None
        raise RecursionError(f"import cycle while resolving {name!r} in {module}")

    def normalized(self, definition: Definition) -> tuple[str, list[Definition], set[str]]:
        """``definition``'s canonical text (references replaced by bare names, docstrings dropped), the gpulab
        definitions it refers to, and its string constants. Computed once per definition."""
        if definition.where not in self._normalized:
            scopes = _Scopes(self, definition.module)
            copies = [scopes.visit(copy.deepcopy(node)) for node in definition.nodes]
            text = "\n".join(_canonical(node) for node in copies if node is not None)
            self._normalized[definition.where] = (text, scopes.reached, scopes.strings)
        return self._normalized[definition.where]

    def experiments(self) -> dict[str, tuple[Definition, Experiment]]:
        """Every recording name declared by an ``@experiment`` in the package, with its function."""
        declared = {}
        for module in self.modules.values():
            for name, nodes in module.definitions.items():
                for node in nodes:
                    found = _read_declaration(node)
                    for recording in found.names if found else ():
                        if recording in declared:
                            raise ValueError(f"recording {recording!r} is declared twice: by "
                                             f"{declared[recording][0].where} and {module.name}.{name}")
                        declared[recording] = (Definition(module.name, name, tuple(nodes)), found)
        return declared


def _is_declaration(decorator: ast.expr) -> bool:
    call = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(call, ast.Name) and call.id == DECORATOR) or (
        isinstance(call, ast.Attribute) and call.attr == DECORATOR)


def _read_declaration(node: ast.stmt) -> Experiment | None:
    if not isinstance(node, ast.FunctionDef):
        return None
    for decorator in node.decorator_list:
        if _is_declaration(decorator) and isinstance(decorator, ast.Call):
            keywords = {k.arg: ast.literal_eval(k.value) for k in decorator.keywords}
            return Experiment(tuple(ast.literal_eval(a) for a in decorator.args), keywords.get("version", 1),
                              tuple(keywords.get("runs", ())))
    return None


@cache
def package_source() -> Source:
    """The package's source, read once per process (a notebook's library does not change while it runs)."""
    return Source()




class _Scopes(ast.NodeTransformer):
    """Copies one definition, replacing each reference to a gpulab definition by its bare name, and collects
    what it referred to. Local names (parameters, assignments, loop variables) shadow module names."""

    def __init__(self, source: Source, module: str):
        self.source, self.module = source, module
        self.scopes: list[tuple[set[str], bool]] = []  # (names bound there, is a class body)
        self.reached: list[Definition] = []
        self.strings: set[str] = set()

    # scopes
    def _bound_in(self, nodes: list[ast.AST], arguments: ast.arguments | None = None) -> set[str]:
        names: set[str] = set()
        declared_global: set[str] = set()
        if arguments is not None:
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                        *filter(None, [arguments.vararg, arguments.kwarg])]:
                names.add(arg.arg)
        stack = list(nodes)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
                stack.extend(node.decorator_list)
                continue  # their bodies are scopes of their own
            if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
            elif isinstance(node, ast.Global | ast.Nonlocal):
                declared_global.update(node.names)
            stack.extend(ast.iter_child_nodes(node))
        return names - declared_global

    def _in_scope(self, node: ast.AST, bound: set[str], is_class: bool = False) -> ast.AST:
        self.scopes.append((bound, is_class))
        try:
            return self.generic_visit(node)
        finally:
            self.scopes.pop()

    def _is_local(self, name: str) -> bool:
        innermost = len(self.scopes) - 1
        return any(name in bound for depth, (bound, is_class) in enumerate(self.scopes)
                   if not is_class or depth == innermost)

    def visit_FunctionDef(self, node):  # noqa: N802 (ast's visitor names)
        node.decorator_list = [self.visit(d) for d in node.decorator_list if not _is_declaration(d)]
        node.returns = None
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                    *filter(None, [node.args.vararg, node.args.kwarg])]:
            arg.annotation = None
        node.args.defaults = [self.visit(d) for d in node.args.defaults]
        node.args.kw_defaults = [d if d is None else self.visit(d) for d in node.args.kw_defaults]
        node.body = _without_docstring(node.body)
        bound = self._bound_in(node.body, node.args)
        self.scopes.append((bound, False))
        try:
            node.body = [kept for kept in map(self.visit, node.body) if kept is not None]
        finally:
            self.scopes.pop()
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_ClassDef(self, node):  # noqa: N802
        node.body = _without_docstring(node.body)
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.bases = [self.visit(b) for b in node.bases]
        node.keywords = [self.visit(k) for k in node.keywords]
        bound = self._bound_in(node.body)
        self.scopes.append((bound, True))
        try:
            node.body = [kept for kept in map(self.visit, node.body) if kept is not None]
        finally:
            self.scopes.pop()
        return node

    def visit_Lambda(self, node):  # noqa: N802
        return self._in_scope(node, self._bound_in([], node.args))

    def _comprehension(self, node):
        bound = set()
        for generator in node.generators:
            bound |= set(_assigned_names(generator.target))
        return self._in_scope(node, bound)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension  # noqa: N815

    # references
    def visit_Constant(self, node):  # noqa: N802
        if isinstance(node.value, str):
            self.strings.add(node.value)
            if node.value in self.source.modules:  # `python -m gpulab.x`: a module named in a string is a reference
                return ast.copy_location(ast.Constant(value=f"module {node.value.rsplit('.', 1)[-1]}"), node)
        return node

    def _reference(self, node: ast.expr) -> ast.expr | None:
        """The bare-name replacement of a gpulab reference (``blas.measure_copy``, ``FORMATS``), or None."""
        chain: list[str] = []
        head = node
        while isinstance(head, ast.Attribute):
            chain.append(head.attr)
            head = head.value
        if not isinstance(head, ast.Name) or not isinstance(head.ctx, ast.Load) or self._is_local(head.id):
            return None
        target = self.source.resolve(self.module, head.id)
        for attribute in reversed(chain):
            if not isinstance(target, ModuleRef):
                return None
            target = self.source.resolve(target.module, attribute)
        if isinstance(target, Definition):
            self.reached.append(target)
            return ast.copy_location(ast.Name(id=target.name, ctx=ast.Load()), node)
        if isinstance(target, ModuleRef):
            return ast.copy_location(ast.Name(id=target.module.rsplit(".", 1)[-1], ctx=ast.Load()), node)
        return None

    def visit_Name(self, node):  # noqa: N802
        return self._reference(node) or node

    def visit_Attribute(self, node):  # noqa: N802
        replaced = self._reference(node)
        return replaced if replaced is not None else self.generic_visit(node)

    def visit_Import(self, node):  # noqa: N802
        # a function's own `from gpulab import kernels` binds a name that refers to a module: resolved above
        return node if not any(a.name.split(".")[0] == PACKAGE for a in node.names) else None

    def visit_ImportFrom(self, node):  # noqa: N802
        source = node.module or ""
        if node.level or source.split(".")[0] == PACKAGE:
            return None
        return node


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:] or [ast.Pass()]
    return body


def _canonical(node: object) -> str:
    """A text of ``node`` that is the same on every Python version the book runs on (3.11 to 3.13): fields that
    are empty, or that newer versions added, are left out, and so are a name's load/store context."""
    if isinstance(node, ast.AST):
        fields = []
        for name, value in ast.iter_fields(node):
            if name in ("ctx", "type_comment", "type_params", "kind") or value is None or value == []:
                continue
            fields.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return "[" + ", ".join(_canonical(item) for item in node) + "]"
    return repr(node)
