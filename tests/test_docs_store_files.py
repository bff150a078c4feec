"""docs/format.md's worked example lists every file its script creates, and no other.

``tests/test_docs_format.py`` checks the sizes the listing states; this
checks that the listing is whole: a new kind of file a store makes on its
first open (as the audit trail's ``AUDIT.*`` did) must be shown to the
reader of the worked example.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_markdown import ROOT, DocError, marked_block

FORMAT = ROOT / "docs" / "format.md"
_HEREDOC = re.compile(r"<<'EOF'\n(.*?)\nEOF\n", re.S)


def listed(text: str, store: str) -> set[str]:
    """The paths the listing block names under ``store/``; an empty directory ends in ``/``."""
    return set(re.findall(rf"^{re.escape(store)}/(\S+)", text, re.M))


def made(store: Path) -> set[str]:
    """Every file under ``store``, and every empty directory with a trailing ``/``."""
    out: set[str] = set()
    for path in store.rglob("*"):
        name = path.relative_to(store).as_posix()
        if path.is_file():
            out.add(name)
        elif path.is_dir() and not any(path.iterdir()):
            out.add(name + "/")
    return out


def script_of(block_text: str) -> str:
    m = _HEREDOC.search(block_text)
    if m is None:
        raise DocError("docs/format.md store-script: no python heredoc (<<'EOF' ... EOF)")
    return m.group(1) + "\n"


def test_the_example_lists_every_file_the_script_makes(tmp_path: Path) -> None:
    script = tmp_path / "store_script.py"
    script.write_text(script_of(marked_block(FORMAT, "store-script").text))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [sys.executable, "-I", script.name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    shown = listed(marked_block(FORMAT, "store-files").text, "example-store")
    assert shown == made(tmp_path / "example-store")


@pytest.mark.parametrize(
    ("listing", "files", "same"),
    [
        ("s/A 1 bytes\ns/d/\n", {"A": b"x", "d/": None}, True),
        ("s/A 1 bytes\n", {"A": b"x", "AUDIT.log": b"{}"}, False),  # a file left out
        ("s/A 1 bytes\ns/B 0 bytes\n", {"A": b"x"}, False),  # a file that is not made
        ("s/d/\n", {"d/x": b""}, False),  # a directory listed empty that is not
    ],
)
def test_the_comparison_sees_a_missing_or_extra_file(
    listing: str, files: dict[str, bytes | None], same: bool, tmp_path: Path
) -> None:
    store = tmp_path / "s"
    store.mkdir()
    for name, data in files.items():
        path = store / name
        if data is None:
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    assert (listed(listing, "s") == made(store)) is same
