"""docs/architecture.md against the tree: the module map, the dependency table, every link.

The module map must name every module of ``statelog/`` and ``compactor/``
and nothing that does not exist; the dependency table must list exactly the
packages of ``pyproject.toml``; every relative link of ``README.md`` and
``docs/*.md`` must reach a file, and every ``#anchor`` a heading of it.
"""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
import unicodedata
from pathlib import Path

import pytest

import statelog
from tests.docs_markdown import ROOT, DocError, links, marked_table

ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("statelog", "compactor")
_PATH = re.compile(r"`((?:statelog|compactor)/(?:\w+/)*(?:\w+\.py)?)`")


def _only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return len(body) == 1 and isinstance(body[0], ast.Expr)


def modules_in_tree() -> set[str]:
    """Every module and package folder of statelog and compactor, as the map writes them.

    A folder is ``statelog/log/``; an ``__init__.py`` that holds only a
    docstring is covered by its folder's row.
    """
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if path.name == "__init__.py":
                if rel != "statelog/__init__.py":
                    found.add(rel.removesuffix("__init__.py"))
                if _only_a_docstring(path):
                    continue
            found.add(rel)
    return found


def modules_in_map(doc: Path = ARCHITECTURE) -> set[str]:
    """The paths named in the first column of the module map (folders end in ``/``)."""
    named: set[str] = set()
    for row in marked_table(doc, "module-map"):
        paths = _PATH.findall(row["Module"])
        if not paths:
            raise DocError(f"module map row {row['Module']!r} names no module path")
        named.update(paths)
    return named


def map_problems(tree: set[str], mapped: set[str]) -> str:
    missing, extra = sorted(tree - mapped), sorted(mapped - tree)
    lines = []
    if missing:
        lines.append("modules missing from the module map of docs/architecture.md:")
        lines += [f"  {m}" for m in missing]
    if extra:
        lines.append("paths in the module map that do not exist:")
        lines += [f"  {m}" for m in extra]
    return "\n".join(lines)


def test_the_module_map_names_every_module_and_nothing_else() -> None:
    problems = map_problems(modules_in_tree(), modules_in_map())
    assert not problems, problems


def test_a_module_missing_from_the_map_is_listed_by_name(tmp_path: Path) -> None:
    text = ARCHITECTURE.read_text()
    row = next(
        line for line in text.splitlines() if line.startswith("| `statelog/log/segments.py`")
    )
    doc = tmp_path / "architecture.md"
    doc.write_text(
        text.replace(row + "\n", "").replace(
            "`statelog/log/reader.py` |", "`statelog/log/gone.py` |"
        )
    )
    problems = map_problems(modules_in_tree(), modules_in_map(doc))
    assert "missing from the module map" in problems and "  statelog/log/segments.py" in problems
    assert "do not exist:\n  statelog/log/gone.py" in problems


def test_the_map_says_what_the_package_re_exports() -> None:
    row = next(
        r
        for r in marked_table(ARCHITECTURE, "module-map")
        if "`statelog/__init__.py`" in r["Module"]
    )
    assert "CompactorLockedError" in statelog.__all__
    assert "`CompactorLockedError` included" in row["Owns"]
    assert "not re-exported" not in ARCHITECTURE.read_text()


# -- dependencies -------------------------------------------------------------------------


def _name(requirement: str) -> str:
    """The distribution name of a requirement, without extras or version: ``moto[server]>=5``."""
    m = re.match(r"^([A-Za-z0-9_.\-]+)", requirement)
    assert m is not None, requirement
    return m.group(1)


def pyproject_dependencies() -> dict[str, set[str]]:
    """Package → the groups of pyproject.toml that list it (``runtime``, or an extra's name)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups: dict[str, set[str]] = {}
    for req in project["dependencies"]:
        groups.setdefault(_name(req), set()).add("runtime")
    for extra, reqs in project["optional-dependencies"].items():
        for req in reqs:
            groups.setdefault(_name(req), set()).add(extra)
    return groups


def documented_dependencies(doc: Path = ARCHITECTURE) -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    for row in marked_table(doc, "dependencies"):
        if row["Kind"] == "standard library":
            continue
        m = re.fullmatch(r"\*\*([^*]+)\*\*", row["Package"])
        if m is None:
            raise DocError(f"dependency row {row['Package']!r}: expected one **package** name")
        kinds = {k.strip().removeprefix("extra ").strip("`") for k in row["Kind"].split(",")}
        name = _name(m.group(1))
        assert row["Used for"].strip(), f"{name}: the table says nothing about what it is for"
        table[name] = kinds
    return table


def test_the_dependency_table_lists_exactly_pyprojects_dependencies() -> None:
    want, shown = pyproject_dependencies(), documented_dependencies()
    missing = sorted(set(want) - set(shown))
    extra = sorted(set(shown) - set(want))
    assert not missing and not extra, f"not in the table: {missing}; not in pyproject: {extra}"
    wrong = {n: (shown[n], want[n]) for n in want if shown[n] != want[n]}
    assert not wrong, f"kind in the table vs pyproject.toml's groups: {wrong}"


# -- links --------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = "".join(c for c in text if c in "-_ " or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found: set[str] = set()
    fenced = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            slug, n = _slug(m.group(1)), 1
            while slug in found:  # repeated headings get -1, -2, ...
                slug = f"{_slug(m.group(1))}-{n}"
                n += 1
            found.add(slug)
    return found


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for line, target in links(doc):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{doc.name}:{line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{doc.name}:{line}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


def test_the_link_check_catches_a_broken_link(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    (tmp_path / "y.md").write_text("# A `Title`: here\n")
    doc.write_text(
        "[ok](y.md#a-title-here) [bad](y.md#nothing) [gone](z.md)\n```\n[no](q.md)\n```\n"
    )
    assert links(doc) == [(1, "y.md#a-title-here"), (1, "y.md#nothing"), (1, "z.md")]
    assert anchors(tmp_path / "y.md") == {"a-title-here"}


# -- names -------------------------------------------------------------------------------

_DOTTED = re.compile(r"\b((?:statelog|compactor)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def resolve(dotted: str) -> bool:
    """Whether ``statelog.a.b.c`` names a module, or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_dotted_name_of_statelog_exists(doc: Path) -> None:
    text = doc.read_text()
    names = {m.group(1).rstrip(".") for m in _DOTTED.finditer(text)}
    names = {n for n in names if not re.search(r"\.(py|md|toml|log|head|json|tmp)$", n)}
    unknown = sorted(n for n in names if not resolve(n))
    assert not unknown, f"{doc.name} names what does not exist: {unknown}"


def test_a_moved_name_is_caught() -> None:
    assert resolve("statelog.sharding.partition.expand_stores")
    assert not resolve("statelog.format.wal.WalWriter")  # the writer is statelog.log.writer
    assert not resolve("statelog.wal_writer")


# -- cited tests ---------------------------------------------------------------------------

_CITED = re.compile(r"`(?:tests/)?(test_\w+\.py)(?:::(\w+))?`|`::(\w+)`")


def cited_tests(doc: Path) -> list[tuple[str, str]]:
    """``(file, function)`` of every test a document cites; ``::name`` is in the last file named."""
    found: list[tuple[str, str]] = []
    last: str | None = None
    for m in _CITED.finditer(doc.read_text()):
        if m.group(1):
            last = m.group(1)  # a bare `test_x.py` names the file later `::name`s are in
            if m.group(2):
                found.append((last, m.group(2)))
        elif last is not None:
            found.append((last, m.group(3)))
    return found


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_cited_test_exists(doc: Path) -> None:
    missing = []
    for name, func in cited_tests(doc):
        path = ROOT / "tests" / name
        if not path.is_file() or func not in _functions(path):
            missing.append(f"{name}::{func}")
    assert not missing, f"{doc.name} cites tests that do not exist: {sorted(set(missing))}"
