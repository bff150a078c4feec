"""The package's shape: the import direction, no import cycle, modules and functions to size.

The import direction is declared once, as import-linter contracts in
``pyproject.toml`` (``[tool.importlinter]``); ``make lint`` checks them and so
does :func:`test_import_contracts_hold`, so ``make test`` fails on a module
that imports upwards. The linter reads function-level imports too: an import
deferred into a function is still an edge of the graph.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("statelog", "compactor")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

# Edges a cycle may run through, each entry with a one-line reason.
CYCLE_EDGES_ALLOWED: set[tuple[str, str]] = set()

# Modules and functions over size, each entry with a one-line reason.
MODULES_OVER_SIZE_ALLOWED: set[str] = set()
FUNCTIONS_OVER_SIZE_ALLOWED: set[str] = set()


def _graph(*, runtime_only: bool = False) -> grimp.ImportGraph:
    """The import graph of the packages; ``runtime_only``: without TYPE_CHECKING imports."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=runtime_only, cache_dir=None)


def _layers_contract() -> tuple[list[grimp.Layer], set[tuple[str, str]]]:
    """The layers, highest first, and the imports the contract ignores."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = (c for c in config["contracts"] if c["type"] == "layers")
    assert contract["containers"] == ["statelog"]
    layers = [grimp.Layer(*(m.strip() for m in layer.split("|"))) for layer in contract["layers"]]
    ignored = set()
    for edge in contract.get("ignore_imports", []):
        importer, _, imported = edge.partition(" -> ")
        ignored.add((importer, imported))
    return layers, ignored


def test_import_contracts_hold() -> None:
    """Every contract in pyproject.toml is kept (the output names each broken import)."""
    run = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True, no_logo=True))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", run], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_the_layers_contract_catches_an_upward_import() -> None:
    """The declared layers are not vacuous: one planted upward import breaks them."""
    graph = _graph()
    layers, ignored = _layers_contract()
    for importer, imported in ignored:
        graph.remove_import(importer=importer, imported=imported)
    assert graph.find_illegal_dependencies_for_layers(layers, {"statelog"}) == set()
    graph.add_import(importer="statelog.format.wal", imported="statelog.log.reader")
    broken = graph.find_illegal_dependencies_for_layers(layers, {"statelog"})
    assert {(d.importer, d.imported) for d in broken} == {("statelog.format", "statelog.log")}


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def edges(m: str) -> Iterator[str]:
        for n in sorted(graph.find_modules_directly_imported_by(m)):
            if n in modules and (m, n) not in CYCLE_EDGES_ALLOWED:
                yield n

    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, edges(start))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, edges(nxt)))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return found


def test_no_import_cycle() -> None:
    """No module reaches itself through the imports that run, deferred ones included.

    A TYPE_CHECKING import never runs: a type named back (a transaction
    annotating its store) is no cycle.
    """
    graph = _graph(runtime_only=True)
    modules = {m for m in graph.modules if m.split(".")[0] in PACKAGES}
    assert "statelog.store.store" in modules
    assert _cycles(graph, modules) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = _graph(runtime_only=True)
    graph.add_import(importer="statelog.format.wal", imported="statelog.log.writer")
    modules = {m for m in graph.modules if m.split(".")[0] in PACKAGES}
    cycles = _cycles(graph, modules)
    assert any({"statelog.format.wal", "statelog.log.writer"} <= set(c) for c in cycles)


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its qualified name (``Class.method``, ``outer.inner``)."""
    todo: list[tuple[str, ast.AST]] = [("", tree)]
    while todo:
        prefix, node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                todo.append((name + ".", child))
            else:
                todo.append((prefix, child))


def test_modules_are_at_most_400_lines() -> None:
    over = {}
    for path in _sources():
        rel = path.relative_to(REPO).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES and rel not in MODULES_OVER_SIZE_ALLOWED:
            over[rel] = lines
    assert over == {}


def test_functions_are_at_most_80_lines() -> None:
    over = {}
    for path in _sources():
        rel = path.relative_to(REPO).as_posix()
        for name, fn in _functions(ast.parse(path.read_text())):
            lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if lines > MAX_FUNCTION_LINES and f"{rel}:{name}" not in FUNCTIONS_OVER_SIZE_ALLOWED:
                over[f"{rel}:{name}"] = lines
    assert over == {}


@pytest.mark.parametrize("allowed", sorted(FUNCTIONS_OVER_SIZE_ALLOWED | MODULES_OVER_SIZE_ALLOWED))
def test_the_allow_lists_name_what_exists(allowed: str) -> None:
    """An allow-list entry whose file was renamed would silently allow nothing."""
    assert (REPO / allowed.partition(":")[0]).is_file()
