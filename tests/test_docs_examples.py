"""Every Python block of README.md and docs/*.md is executed, or says why not.

A block with no marker is a script: it must import what it uses and is run
in a fresh directory (the blocks of one document in order, in the same
directory, so a later block can use the store an earlier one made). The
README's blocks run twice in a row, as a user trying them would: the second
run must not fail (offsets and watermarks never go backwards, so they
resume from the store) and the first block must print what it did.

Other blocks carry a marker on the line above (see :mod:`tests.docs_markdown`):

* ``<!-- excerpt: examples/kafka_reconciler.py -->``: a verbatim excerpt of
  that file, which its own tests run (``tests/test_guide.py``);
* ``<!-- example: NAME -->``: run and compared by ``tests/test_docs_format.py``;
* ``<!-- not-run: REASON -->``: not run here, for the reason given (a
  benchmark of minutes, an object store); never in README.md or
  docs/guide.md, whose every block runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_markdown import ROOT, Block, DocError, blocks

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ALWAYS_RUN = {ROOT / "README.md", ROOT / "docs" / "guide.md"}
FORMAT_TEST = Path(__file__).with_name("test_docs_format.py")


def python_blocks(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.lang == "python"]


def scripts(doc: Path) -> list[Block]:
    return [b for b in python_blocks(doc) if b.marker is None]


def run_block(block: Block, cwd: Path) -> str:
    script = cwd / f"block-{block.line}.py"
    script.write_text(block.text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.where} failed:\n{block.text}\n{done.stderr}"
    return done.stdout


def check_marker(block: Block) -> None:
    """The promise a marked block makes holds: an excerpt is verbatim, an example is tested."""
    assert block.marker is not None
    kind, value = block.marker
    if kind == "excerpt":
        source = ROOT / value
        assert source.is_file(), f"{block.where}: excerpt of {value}, which does not exist"
        assert block.text in source.read_text(), f"{block.where}: not verbatim in {value}"
    elif kind == "example":
        assert f'"{value}"' in FORMAT_TEST.read_text(), (
            f"{block.where}: example {value!r} is run by no test of {FORMAT_TEST.name}"
        )
    elif kind == "not-run":
        assert block.doc not in ALWAYS_RUN, f"{block.where}: every block of this document runs"
        assert len(value.split()) >= 2, f"{block.where}: say why the block is not run"
    else:
        raise DocError(f"{block.where}: unknown marker {kind!r}")


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_marked_python_block_keeps_its_promise(doc: Path) -> None:
    for block in python_blocks(doc):
        if block.marker is not None:
            check_marker(block)


def test_the_guide_and_the_readme_show_code() -> None:
    assert len(python_blocks(ROOT / "docs" / "guide.md")) >= 8
    assert len(scripts(ROOT / "README.md")) >= 2


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if d.name != "README.md" and scripts(d)], ids=lambda d: d.name
)
def test_the_scripts_of_a_document_run(doc: Path, tmp_path: Path) -> None:
    for block in scripts(doc):
        run_block(block, tmp_path)


def test_the_readme_runs_twice_in_a_row(tmp_path: Path) -> None:
    readme = scripts(ROOT / "README.md")
    first = [run_block(b, tmp_path) for b in readme]
    second = [run_block(b, tmp_path) for b in readme]
    assert first[0].strip() and second[0].strip(), "the Use block prints what it did"
    assert first[0] != second[0], "the second run goes on from the first"
    assert "rows=1" in first[1] and "rows=0" in second[1], "the sink writes the row once"


def test_an_edited_excerpt_is_caught(tmp_path: Path) -> None:
    guide = ROOT / "docs" / "guide.md"
    block = python_blocks(guide)[0]
    doc = tmp_path / "guide.md"
    doc.write_text(guide.read_text().replace(block.text, block.text.replace("(", "( ", 1), 1))
    edited = python_blocks(doc)[0]
    with pytest.raises(AssertionError, match="not verbatim"):
        check_marker(edited)


def test_a_failing_block_fails_with_its_place(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n```python\nimport statelog\nstatelog.open(1)\n```\n")
    with pytest.raises(AssertionError, match=r"x\.md:4 failed"):
        run_block(scripts(doc)[0], tmp_path)
