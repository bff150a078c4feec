"""Reading the parts of statelog's Markdown documents that tests execute.

A table or a fenced block that a test relies on is marked by an HTML
comment on the line above it (blank lines between are allowed)::

    <!-- table: frame-header -->
    | Offset | Size | ... |

    <!-- example: segment-xxd -->
    ```
    00000000: 5354 ...
    ```

Markers are invisible when the document is rendered. A marker that is
missing, or that is not followed by a table or a block, fails with a
message naming the document and the marker, so a doc edit that breaks a
table fails the test that reads it instead of silently testing less.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ROOT",
    "Block",
    "DocError",
    "blocks",
    "cell_code",
    "hex_dump_bytes",
    "links",
    "marked_block",
    "marked_table",
]

ROOT = Path(__file__).resolve().parent.parent

_MARKER = re.compile(r"^<!--\s*([a-z][a-z-]*):\s*(.+?)\s*-->\s*$")
_FENCE = re.compile(r"^(```+)\s*([A-Za-z0-9_+-]*)\s*$")
_XXD = re.compile(r"^[0-9a-f]{8}: ((?:[0-9a-f]{2,4} ){0,8})")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


class DocError(AssertionError):
    """A document does not have the shape a test reads: the message says where."""


@dataclass(frozen=True)
class Block:
    """A fenced block: its language tag, text, first line (1-based) and its marker, if any."""

    doc: Path
    lang: str
    text: str
    line: int
    marker: tuple[str, str] | None

    @property
    def where(self) -> str:
        return f"{_name(self.doc)}:{self.line}"


def _name(doc: Path) -> str:
    return str(doc.relative_to(ROOT)) if doc.is_relative_to(ROOT) else str(doc)


def _lines(doc: Path) -> list[str]:
    return doc.read_text(encoding="utf-8").splitlines()


def _marker_at(lines: list[str], kind: str, name: str, doc: Path) -> int:
    """Index of the first non-blank line after the marker ``<!-- kind: name -->``."""
    found = [
        i
        for i, line in enumerate(lines)
        if (m := _MARKER.match(line)) and m.group(1) == kind and m.group(2) == name
    ]
    if len(found) != 1:
        raise DocError(
            f"{_name(doc)}: expected exactly one `<!-- {kind}: {name} -->` marker, "
            f"found {len(found)}"
        )
    i = found[0] + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i


def _split_row(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def marked_table(doc: Path, name: str) -> list[dict[str, str]]:
    """The rows of the table under ``<!-- table: name -->``, as header → cell text."""
    lines = _lines(doc)
    i = _marker_at(lines, "table", name, doc)
    where = f"{_name(doc)}:{i + 1} (table {name!r})"
    if i + 1 >= len(lines) or not lines[i].startswith("|") or not lines[i + 1].startswith("|"):
        raise DocError(f"{where}: the marker is not followed by a Markdown table")
    header = _split_row(lines[i])
    rows: list[dict[str, str]] = []
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        cells = _split_row(line)
        if len(cells) != len(header):
            raise DocError(f"{where}: row {line!r} has {len(cells)} cells, header {len(header)}")
        rows.append(dict(zip(header, cells, strict=True)))
    if not rows:
        raise DocError(f"{where}: the table has no rows")
    return rows


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of ``doc``, in order, with the marker above it (if any)."""
    lines = _lines(doc)
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        start, fence = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        if j == len(lines):
            raise DocError(f"{_name(doc)}:{start + 1}: unclosed code block")
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = _MARKER.match(lines[k]) if k >= 0 else None
        marker = (mark.group(1), mark.group(2)) if mark else None
        text = "\n".join(lines[start + 1 : j]) + "\n"
        out.append(Block(doc, m.group(2), text, start + 2, marker))
        i = j + 1
    return out


def marked_block(doc: Path, name: str, kind: str = "example") -> Block:
    """The fenced block under ``<!-- kind: name -->``."""
    found = [b for b in blocks(doc) if b.marker == (kind, name)]
    if len(found) != 1:
        _marker_at(_lines(doc), kind, name, doc)  # names a missing or doubled marker
        raise DocError(f"{_name(doc)}: `<!-- {kind}: {name} -->` is not above a block")
    return found[0]


def hex_dump_bytes(block: Block) -> bytes:
    """The bytes an ``xxd`` dump shows (offsets checked to be consecutive)."""
    data = bytearray()
    for n, line in enumerate(block.text.splitlines()):
        m = _XXD.match(line)
        if m is None:
            raise DocError(f"{block.where}: line {n + 1} of the dump is not xxd output: {line!r}")
        if int(line[:8], 16) != len(data):
            raise DocError(f"{block.where}: dump line {n + 1} starts at the wrong offset")
        data += bytes.fromhex(m.group(1).replace(" ", ""))
    return bytes(data)


def cell_code(cell: str) -> str:
    """The text of the first ``code`` span in a table cell (the cell itself if none)."""
    m = re.search(r"`([^`]*)`", cell)
    return m.group(1) if m else cell.strip()


def links(doc: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every inline link outside code blocks and code spans."""
    out: list[tuple[int, str]] = []
    fenced = False
    for n, line in enumerate(_lines(doc), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        out.extend((n, m.group(1)) for m in _LINK.finditer(re.sub(r"`[^`]*`", "", line)))
    return out
