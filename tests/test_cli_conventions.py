"""The conventions ``statelog`` and ``statelog-compactor`` share.

| convention                      | checked by                                                   |
|---------------------------------|--------------------------------------------------------------|
| one exit-status table           | each situation run through both commands gives one status:   |
|                                 | clean 0, damage walked past 1, no base 2, missing store 3,   |
|                                 | bad option 3, compactor lock held 4, newer store version 5   |
| command-only statuses           | statelog: writer lock 4, not a directory 3, torn tail 1;     |
|                                 | daemon: failing disk 5, damaged SHARDS 1, metrics port 3     |
| the table in both --help        | the same text in both epilogs, every status in it            |
| durations                       | 30 30s 1.5s 500ms 5m 1h 7d on every duration option of both; |
|                                 | 0 -5 1w 1e3 0.5ms nan "" refused with the usage status       |
| sizes                           | 67108864 64k 64KiB 64MiB 1G on every size option of both;    |
|                                 | 64KB -1 1.5 x refused with the usage status                  |
| --version                       | ``statelog X.Y.Z`` from both, status 0                       |
| -q -v --traceback               | after every subcommand's name, and before it                 |
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path

import pytest

import compactor
import statelog
from compactor import daemon
from compactor.options import EXIT_BAD_OPTIONS, EXIT_FAILED, EXIT_FENCED, EXIT_LOCKED
from compactor.options import parse_args as compactor_args
from statelog.cli import build_parser
from statelog.cli import main as statelog_main
from statelog.cli.exits import EXIT_CODES, EXIT_CODES_HELP, gravest
from statelog.compaction.lock import CompactorLock
from statelog.storage.fileio import FileLayer
from tests.test_verify import build_stores

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``clean`` and its damaged copies (``torn``, ``bitflip``, ``snapshot``, ``exhausted``)."""
    return build_stores(tmp_path_factory.mktemp("conventions"))


def run_statelog(*args: str | Path) -> int:
    return statelog_main([*map(str, args)])


def run_daemon(*args: str | Path, files: FileLayer | None = None) -> int:
    """``statelog-compactor ARGS`` in this process; a usage error's SystemExit as its status."""
    try:
        return daemon.main([*map(str, args)], files=files)
    except SystemExit as exc:
        assert isinstance(exc.code, int)
        return exc.code


def newer_version(store: Path) -> None:
    doc = json.loads((store / "IDENTITY").read_text())
    (store / "IDENTITY").write_text(json.dumps({**doc, "version": doc["version"] + 1}))


@contextmanager
def compactor_lock(store: Path) -> Iterator[None]:
    lock = CompactorLock(store)  # stands in for a running daemon
    try:
        yield
    finally:
        lock.release()


Setup = Callable[[Path], AbstractContextManager[None] | None]


def as_is(store: Path) -> None:
    """Leave the store as it was built."""


BAD_SIZE = ["--min-tail-bytes", "64KB"]

# (situation, store it starts from or None for none, what to do to it, the
# statelog compact options, the daemon's options, the status both must give)
SHARED: list[tuple[str, str | None, Setup, list[str], list[str], int]] = [
    ("clean store", "clean", as_is, [], [], 0),
    ("damage walked past", "bitflip", as_is, [], [], 1),
    ("no snapshot verifies", "exhausted", as_is, [], [], 2),
    ("no store there", None, as_is, [], [], 3),
    ("bad option", "clean", as_is, ["--retain", "0"], ["--retain", "0"], 3),
    ("bad duration", "clean", as_is, ["--retain-for", "1w"], ["--interval", "1w"], 3),
    ("bad size", "clean", as_is, BAD_SIZE, BAD_SIZE, 3),
    ("compactor lock held", "clean", compactor_lock, [], [], 4),
    ("newer store version", "clean", newer_version, [], [], 5),
]


@pytest.mark.parametrize(
    ("situation", "start", "setup", "cli_opts", "daemon_opts", "code"),
    SHARED,
    ids=[row[0] for row in SHARED],
)
def test_one_situation_one_status_from_both_commands(
    stores: dict[str, Path],
    tmp_path: Path,
    situation: str,
    start: str | None,
    setup: Setup,
    cli_opts: list[str],
    daemon_opts: list[str],
    code: int,
) -> None:
    got = {}
    for command in ("statelog compact", "statelog-compactor --once"):
        store = tmp_path / command.split()[0]
        if start is not None:
            shutil.copytree(stores[start], store)
        with setup(store) or nullcontext():
            if command == "statelog compact":
                got[command] = run_statelog("compact", "-q", store, *cli_opts)
            else:
                got[command] = run_daemon("--once", "--min-tail-bytes", "0", *daemon_opts, store)
    assert got == {"statelog compact": code, "statelog-compactor --once": code}, situation


@contextmanager
def writer_holds(store: Path) -> Iterator[None]:
    with statelog.open(store):
        yield


@pytest.mark.parametrize(
    ("argv", "start", "setup", "code"),
    [
        (["verify", "{store}"], "clean", None, 0),
        (["verify", "{store}"], "torn", None, 1),
        (["verify", "{store}"], "exhausted", None, 2),
        (["inspect", "{store}"], "file", None, 3),
        (["verify", "--no-such-option", "{store}"], "clean", None, 3),
        (["recover", "{store}"], "clean", writer_holds, 4),
        (["compact", "-q", "{store}"], "clean", compactor_lock, 4),
    ],
)
def test_statelog_exit_statuses(
    stores: dict[str, Path],
    tmp_path: Path,
    argv: list[str],
    start: str,
    setup: Setup | None,
    code: int,
) -> None:
    store = tmp_path / "s"
    if start == "file":
        store.write_text("not a store")
    else:
        shutil.copytree(stores[start], store)
    with (setup(store) if setup else None) or nullcontext():
        assert run_statelog(*[a.format(store=store) for a in argv]) == code


class FullDisk(FileLayer):
    """Every rename fails as on a full disk: no snapshot can be put in place."""

    def rename(self, src: Path, dst: Path) -> None:
        raise OSError(28, "No space left on device")


def test_daemon_pass_that_fails_exits_5(stores: dict[str, Path], tmp_path: Path) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    assert run_daemon("--once", "--min-tail-bytes", "0", store, files=FullDisk()) == 5


def test_daemon_damaged_shards_manifest_exits_1(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "SHARDS").write_text("{not json")
    assert run_daemon("--once", root) == 1


def test_daemon_metrics_port_taken_exits_with_the_usage_status(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert run_daemon("--once", "--metrics-port", port, store) == 3


def test_daemon_once_reports_the_locked_store_before_a_missing_one(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    store = tmp_path / "s"
    shutil.copytree(stores["clean"], store)
    with compactor_lock(store):
        assert run_daemon("--once", tmp_path / "missing", store) == 4


def test_the_daemons_exported_names_are_the_shared_statuses() -> None:
    assert (EXIT_BAD_OPTIONS, EXIT_LOCKED, EXIT_FENCED, EXIT_FAILED) == (3, 4, 4, 5)
    assert (daemon.EXIT_BAD_OPTIONS, daemon.EXIT_LOCKED, daemon.EXIT_FENCED) == (3, 4, 4)


@pytest.mark.parametrize(
    ("codes", "want"),
    [([], 0), ([0, 0], 0), ([3, 5], 5), ([5, 1], 1), ([1, 2], 2), ([2, 4, 3], 4), ([3], 3)],
)
def test_several_outcomes_give_the_gravest_status(codes: list[int], want: int) -> None:
    assert gravest(codes) == want


def test_both_helps_print_the_one_exit_status_table() -> None:
    for module in ("statelog.cli", "compactor"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True
        )
        assert done.returncode == 0 and EXIT_CODES_HELP in done.stdout, module
    for code, _meaning in EXIT_CODES:
        assert f"\n  {code:<4} " in EXIT_CODES_HELP


# -- durations and sizes ----------------------------------------------------------------

GOOD_DURATIONS = {
    "30": 30.0,
    "30s": 30.0,
    "1.5s": 1.5,
    "500ms": 0.5,
    "5m": 300.0,
    "1h": 3600.0,
    "7d": 604800.0,
    " 90s ": 90.0,
}
BAD_DURATIONS = ["0", "-5", "1w", "1e3", "0.5ms", "nan", "", "5 minutes", "99999999999d", "5M"]

# Every duration option of both commands: (command, argv before the value, after it, dest).
DURATION_OPTIONS = [
    ("statelog", ["compact", "S", "--retain-for"], [], "retain_for"),
    ("statelog", ["tail", "S", "--poll"], [], "poll"),
    ("compactor", ["--interval"], ["S"], "interval"),
    ("compactor", ["--retain-for"], ["S"], "retain_for"),
    ("compactor", ["--remote", "s3://bucket/p", "--remote-retain-for"], ["S"], "remote_retain_for"),
    ("compactor", ["--remote", "s3://bucket/p", "--max-ship-lag"], ["S"], "max_ship_lag"),
]
SIZE_OPTIONS = [
    ("statelog", ["compact", "S", "--min-tail-bytes"], [], "min_tail_bytes"),
    ("compactor", ["--min-tail-bytes"], ["S"], "min_tail_bytes"),
]
GOOD_SIZES = {
    "67108864": 64 << 20,
    "64k": 64 << 10,
    "64K": 64 << 10,
    "64KiB": 64 << 10,
    "64MiB": 64 << 20,
    "1G": 1 << 30,
    "1.5GiB": 3 << 29,
    "512b": 512,
    "0": 0,
}
BAD_SIZES = ["64KB", "-1", "1.5", "x", "", "1e6", "64 MB", "1.0001k"]
# The daemon's bounded integers: (option, the lowest, the highest).
BOUNDED_OPTIONS = [("--level", 1, 22), ("--nice", 0, 19), ("--retain", 1, None)]


def parsed(command: str, argv: list[str]) -> argparse.Namespace:
    if command == "statelog":
        return build_parser().parse_args(argv)
    return compactor_args(argv)[0]


def refused(command: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The usage message; the status must be the usage status of both commands."""
    with pytest.raises(SystemExit) as exc:
        parsed(command, argv)
    assert exc.value.code == 3
    return capsys.readouterr().err


def as_seconds(value: object) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    assert isinstance(value, float)
    return value


@pytest.mark.parametrize(("command", "before", "after", "dest"), DURATION_OPTIONS)
@pytest.mark.parametrize("text", sorted(GOOD_DURATIONS))
def test_every_duration_option_accepts_the_one_syntax(
    command: str, before: list[str], after: list[str], dest: str, text: str
) -> None:
    args = parsed(command, [*before, text, *after])
    assert as_seconds(getattr(args, dest)) == pytest.approx(GOOD_DURATIONS[text])


@pytest.mark.parametrize(("command", "before", "after", "dest"), DURATION_OPTIONS)
@pytest.mark.parametrize("text", BAD_DURATIONS)
def test_every_duration_option_refuses_the_rest_with_examples(
    command: str,
    before: list[str],
    after: list[str],
    dest: str,
    text: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(command, [*before, text, *after], capsys)
    assert f"not a duration: {text!r}" in err and "500ms" in err and "5m" in err


@pytest.mark.parametrize(("command", "before", "after", "dest"), SIZE_OPTIONS)
@pytest.mark.parametrize("text", sorted(GOOD_SIZES))
def test_every_size_option_accepts_the_one_syntax(
    command: str, before: list[str], after: list[str], dest: str, text: str
) -> None:
    assert getattr(parsed(command, [*before, text, *after]), dest) == GOOD_SIZES[text]


@pytest.mark.parametrize(("command", "before", "after", "dest"), SIZE_OPTIONS)
@pytest.mark.parametrize("text", BAD_SIZES)
def test_every_size_option_refuses_the_rest_with_examples(
    command: str,
    before: list[str],
    after: list[str],
    dest: str,
    text: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(command, [*before, text, *after], capsys)
    assert f"not a size: {text!r}" in err and "64MiB" in err and "1G" in err


# -- --version and the common options ---------------------------------------------------


def test_version_of_both_commands(capsys: pytest.CaptureFixture[str]) -> None:
    want = f"statelog {importlib.metadata.version('statelog')}\n"
    assert statelog_main(["--version"]) == 0
    assert capsys.readouterr().out == want
    with pytest.raises(SystemExit) as exc:
        compactor.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == want
    done = subprocess.run(
        [sys.executable, "-m", "compactor", "--version"], cwd=REPO, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, want)


# The positional arguments each subcommand needs to parse.
POSITIONALS = {
    "inspect": ["S"],
    "verify": ["S"],
    "recover": ["S"],
    "compact": ["S"],
    "dump": ["S"],
    "tail": ["S"],
    "audit": ["S"],
    "drill": ["temp"],
    "restore": ["s3://bucket/p", "S"],
    "promote": ["S"],
}


def test_the_table_below_names_every_subcommand() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(POSITIONALS)


@pytest.mark.parametrize("command", sorted(POSITIONALS))
@pytest.mark.parametrize("where", ["after", "before"])
def test_common_options_around_every_subcommand(command: str, where: str) -> None:
    common = ["-q", "-vv", "--traceback"]
    tail = [command, *POSITIONALS[command]]
    args = build_parser().parse_args([*tail, *common] if where == "after" else [*common, *tail])
    assert (args.quiet, args.verbose, args.traceback) == (True, 2, True)


def test_common_options_default_off_after_a_subcommand() -> None:
    args = build_parser().parse_args(["drill", "temp"])
    assert (args.quiet, args.verbose, args.traceback) == (False, 0, False)


@pytest.mark.parametrize(
    ("argv", "level"),
    [([], "INFO"), (["-v"], "DEBUG"), (["-q"], "WARNING"), (["--log-level", "error"], "ERROR")],
)
def test_the_daemon_takes_q_and_v_as_log_levels(argv: list[str], level: str) -> None:
    assert compactor_args([*argv, "S"])[0].log_level == level


def test_the_daemon_refuses_q_with_v(capsys: pytest.CaptureFixture[str]) -> None:
    assert "give one of them" in refused("compactor", ["-q", "-v", "S"], capsys)


@pytest.mark.parametrize(("option", "low", "high"), BOUNDED_OPTIONS)
def test_the_daemons_bounded_integers_refuse_what_is_out_of_range(
    option: str, low: int, high: int | None, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = option.removeprefix("--")
    assert getattr(parsed("compactor", [option, str(low), "S"]), dest) == low
    assert "is below" in refused("compactor", [option, str(low - 1), "S"], capsys)
    assert "not a number" in refused("compactor", [option, "x", "S"], capsys)
    if high is not None:
        assert getattr(parsed("compactor", [option, str(high), "S"]), dest) == high
        assert "is above" in refused("compactor", [option, str(high + 1), "S"], capsys)
