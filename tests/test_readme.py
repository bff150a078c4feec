"""README.md as a new user meets it: its Python blocks run, its install table is true.

Each ``python`` block of the README is a script a user would paste into a
file and run in an empty directory of their own, with statelog installed
and nothing else of this repository importable. So each one is written to
a fresh directory of its own and run there with the environment's Python,
twice: it must exit 0 and print something both times (a block that commits
fixed offsets fails the second time, as offsets never go backwards; one
that reads a table it never declared fails the first time).

A block that cannot run alone (it needs a PostgreSQL server, a broker) says
so on the line above it, ``<!-- not-run: REASON -->``; the README should
need very few of those, and each must give its reason.

The extras table (``<!-- table: extras -->``) names exactly the extras
``pyproject.toml`` defines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.docs_markdown import ROOT, Block, blocks, cell_code, marked_table

README = ROOT / "README.md"
MAX_NOT_RUN = 2
"""At most this many README blocks may be left unrun: the README is what users paste."""


def python_blocks(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.lang == "python"]


def runnable(doc: Path) -> list[Block]:
    """The blocks a test must run: every Python block not marked ``not-run``."""
    return [b for b in python_blocks(doc) if b.marker is None or b.marker[0] != "not-run"]


def clean_env() -> dict[str, str]:
    """The environment without anything that would put this checkout on the path."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def run_script(block: Block, cwd: Path, run: int) -> str:
    """Run ``block`` as ``cwd/readme_block.py`` with cwd as its directory; its stdout.

    :raises AssertionError: it exited non-zero or printed nothing; the message
        names the block's line, the run and the stderr.
    """
    script = cwd / "readme_block.py"
    script.write_text(block.text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-I", script.name],  # -I: no PYTHON* variables, no user site
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    where = f"{block.where} (run {run})"
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{block.text}\n{done.stderr}"
    assert done.stdout.strip(), f"{where} printed nothing:\n{block.text}"
    return done.stdout


@pytest.mark.parametrize("block", runnable(README), ids=lambda b: f"README.md:{b.line}")
def test_a_readme_block_runs_twice_alone(block: Block, tmp_path: Path) -> None:
    first = run_script(block, tmp_path, 1)
    second = run_script(block, tmp_path, 2)
    assert first and second


def test_the_readme_has_code_and_few_unrun_blocks() -> None:
    every = python_blocks(README)
    assert len(runnable(README)) >= 3, "the README shows runnable code"
    unrun = [b for b in every if b.marker is not None and b.marker[0] == "not-run"]
    assert len(unrun) <= MAX_NOT_RUN, [b.where for b in unrun]
    for b in unrun:
        assert b.marker is not None and len(b.marker[1].split()) >= 2, f"{b.where}: say why"


def test_the_use_block_goes_on_from_the_last_run(tmp_path: Path) -> None:
    use = runnable(README)[0]
    first = run_script(use, tmp_path, 1)
    second = run_script(use, tmp_path, 2)
    assert first != second, "the second run prints the same: it did not resume from the store"


def test_the_blocks_see_no_file_of_the_repository(tmp_path: Path) -> None:
    code = (
        "import importlib.util as u\n"
        "print(*(u.find_spec(m) is not None for m in ('statelog', 'tests', 'benchmarks')))\n"
    )
    probe = Block(README, "python", code, 0, None)
    assert run_script(probe, tmp_path, 1).split() == ["True", "False", "False"]


@pytest.mark.parametrize(
    ("text", "fails"),
    [
        ("print('ok')\n", None),
        ("import sys\nsys.exit(3)\n", "exited 3"),
        ("x = 1\n", "printed nothing"),
        # A script that only works once, as fixed offsets only commit once.
        (
            "from pathlib import Path\np = Path('once')\nassert not p.exists()\n"
            "p.touch()\nprint('made')\n",
            "run 2",
        ),
    ],
)
def test_the_runner_catches_a_bad_block(text: str, fails: str | None, tmp_path: Path) -> None:
    block = Block(tmp_path / "x.md", "python", text, 3, None)
    if fails is None:
        run_script(block, tmp_path, 1)
        run_script(block, tmp_path, 2)
        return
    with pytest.raises(AssertionError, match=fails):
        run_script(block, tmp_path, 1)
        run_script(block, tmp_path, 2)


def test_the_extras_table_names_every_extra_of_pyproject() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    defined = set(pyproject["project"]["optional-dependencies"])
    shown = [cell_code(row["Extra"]) for row in marked_table(README, "extras")]
    assert len(shown) == len(set(shown)), f"an extra is listed twice: {shown}"
    assert set(shown) == defined


@pytest.mark.parametrize(
    "words",
    [
        "pip install 'statelog[",
        "pip install .",
        "`make demo`",
        "`dev` extra",
        "tables=",
        "DataLossWarning",
        "strict=True",
        "logging.captureWarnings(True)",
    ],
)
def test_the_readme_says_how_to_start(words: str) -> None:
    assert words in README.read_text(encoding="utf-8")
