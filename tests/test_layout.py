"""The code's shape, checked: no import cycles between modules, and no production module too long to read.

The dependency rules between packages are `lint-imports` contracts (``[tool.importlinter]`` in
``pyproject.toml``, run by ``scripts/test.sh``); this checks what those contracts cannot say."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "topics", "connectors", "trainer_sink")
MAX_MODULE_LINES = 400
"""A review trigger, not a target: a module past it is either split along a concept or listed below."""
REVIEWED_LONG_MODULES = {
    # One local server's whole life (start, stop, faults for the tests, its users), each part a few lines.
    "pipeline/tools/stack/object_store.py": 460,
}
"""Modules read past ``MAX_MODULE_LINES`` and kept whole, each with why, up to the length given."""
MAX_FUNCTION_LINES = 80


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_import_cycles() -> None:
    # Imports made only for type checking count: a circle through an annotation is still one to follow.
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    # A package's __init__ re-exporting its modules is not a cycle a reader has to follow.
    for module in sorted(graph.modules):
        if graph.is_module_squashed(module):
            continue
        for child in graph.find_children(module):
            if graph.direct_import_exists(importer=child, imported=module):
                graph.remove_import(importer=child, imported=module)
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "b", "c", "d"):
        graph.add_module(name)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert _cycles(graph) == [["a", "b", "c"]]


def test_production_modules_are_short() -> None:
    long = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            lines = len(path.read_text().splitlines())
            name = str(path.relative_to(REPO))
            if lines > REVIEWED_LONG_MODULES.get(name, MAX_MODULE_LINES):
                long[name] = lines
    assert long == {}, f"production modules over {MAX_MODULE_LINES} lines: {long}"


OPTIONAL = frozenset({"torchtitan", "lightning", "transformers", "accelerate"})
"""The frameworks of the trainer integrations' extras; scripts/setup.sh installs all but torchtitan."""


def test_every_exported_name_resolves() -> None:
    """Packages load their names lazily (``lazy_loader``), so a name that no longer exists would only fail
    where it is used: every module is imported and every name in its ``__all__`` looked up here."""
    missing = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names = [package, *(info.name for info in pkgutil.walk_packages(root.__path__, f"{package}."))]
        for name in names:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if name.startswith("trainer_sink.integrations.") and (exc.name or "").split(".")[0] in OPTIONAL:
                    continue  # an integration whose framework (an optional extra) is not installed here
                raise
            missing += [f"{name}.{attr}" for attr in getattr(module, "__all__", ()) if not hasattr(module, attr)]
    assert missing == []


def test_production_functions_are_short() -> None:
    long = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1 if node.end_lineno else 0
                    if lines > MAX_FUNCTION_LINES:
                        long[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = lines
    assert long == {}, f"production functions over {MAX_FUNCTION_LINES} lines: {long}"
