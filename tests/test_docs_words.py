"""The documentation speaks of what a user can see.

README.md, docs/*.md and the ``--help`` of ``statelog`` (every subcommand)
and ``statelog-compactor`` are read by people who have the package and this
repository, nothing else. So none of them may point at things only the
project's own history holds: a tracker's issue numbers, the task
descriptions work was done from, the project's predecessor, or a path of
the machine the text was written on.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactor.options import build_parser as compactor_parser
from statelog.cli import build_parser as statelog_parser
from tests.docs_markdown import ROOT

FORBIDDEN: dict[str, re.Pattern[str]] = {
    "an issue number": re.compile(r"(?i)\bissues?\s+#?\d"),
    # `#12` as a reference, not a format spec (`{crc:#010x}`), an anchor or an entity.
    "a #number reference": re.compile(r"(?<![\w:&{#/])#\d+\b(?![\w-])"),
    "the word 'brief'": re.compile(r"(?i)\bbriefs?\b"),
    "the predecessor ('seed's', 'seed-style')": re.compile(r"(?i)\bseed(?:'s|\u2019s|-style)"),
    "'Departures from the'": re.compile(r"(?i)\bdepartures from the\b"),
    "a path of this machine": re.compile(r"/work/|/tmp/pytest|/home/"),
}

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def hits(text: str) -> list[str]:
    """Each forbidden phrase in ``text``: ``line N: what (the text around it)``."""
    found: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            found.extend(
                f"line {n}: {what} ({line.strip()[:120]!r})" for _ in pattern.finditer(line)
            )
    return found


def _helps(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, str]]:
    yield name, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _helps(child, f"{name} {sub}")


def help_texts() -> dict[str, str]:
    """``--help`` of every command and subcommand, by command line."""
    return dict(
        [*_helps(statelog_parser(), "statelog"), *_helps(compactor_parser(), "statelog-compactor")]
    )


HELPS = help_texts()


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_a_document_names_nothing_a_user_cannot_see(doc: Path) -> None:
    assert hits(doc.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("command", sorted(HELPS))
def test_a_help_text_names_nothing_a_user_cannot_see(command: str) -> None:
    assert hits(HELPS[command]) == []


def test_every_command_and_subcommand_is_read() -> None:
    subcommands = {c.split(" ", 1)[1] for c in HELPS if c.startswith("statelog ")}
    assert {"inspect", "verify", "recover", "compact", "dump", "audit", "drill"} <= subcommands
    assert "statelog-compactor" in HELPS


@pytest.mark.parametrize(
    ("text", "caught"),
    [
        ("fixed in issue 6", True),
        ("see Issues #2/3", True),
        ("as reported in #12.", True),
        ("(#7)", True),
        ("what the brief asks", True),
        ("the seed's table", True),
        ("a seed-style JSON restore", True),
        ("## Departures from the design", True),
        ("written to /work/main/state", True),
        ("under /tmp/pytest-of-root/x", True),
        ("in /home/alice/store", True),
        ("`statelog drill --seed 42`: the same seed, the same workload", False),
        ('print(f"{crc:#010x}")', False),
        ("[the trail](#audit-trail-auditlog-audithead)", False),
        ("a briefly held lock", False),
        ("a seeded workload", False),
        ("/var/lib/app/tables and /tmp/state", False),
        ("&#8212; an entity", False),
    ],
)
def test_the_check_catches_what_it_should_and_only_that(text: str, caught: bool) -> None:
    assert bool(hits(text)) is caught, hits(text)
