"""A standby's copy is never a writer until it is promoted (``STANDBY``).

| how the copy is used                          | expected                                      |
|-----------------------------------------------|-----------------------------------------------|
| ``statelog.open(COPY)``, standby running      | StoreLockedError (the standby holds the lock) |
| ``statelog.open(COPY)``, standby gone         | StandbyCopyError, not a byte changed          |
| ``compact(COPY)``, ``statelog recover COPY``  | refused the same way (CLI exit 4)             |
| ``ShardedStore(COPY)`` of a standby root      | refused: no shard opens as a writer           |
| ``statelog.open(COPY, readonly=True)``        | reads the copy as it stands                   |
| ``statelog promote COPY`` (no ``--source``)   | promotes from the source the copy names       |
| a promotion died after its claim              | the next writer's open finishes it            |
| a ``STANDBY`` planted as a FIFO or garbage    | refused at once, never waited on              |
| the source rewound, sealed again, same size   | the copy takes the source's log               |
| ``promote --force`` on a root, standby runs   | exit 4, every mark kept                       |
| a relative ``follow=``, promoted elsewhere    | the mark names the source absolutely          |
| ``follow=`` into a directory promoted away    | refused: it could never be promoted itself    |
| the mark cannot be removed during promotion   | typed error, the copy's lock released         |
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import statelog
from statelog.cli import main as cli_main
from statelog.compaction.fold import compact
from statelog.kit.workload import Stream, run_commit, store_digest
from statelog.replica.promoted import claim_source
from statelog.storage.layout import STANDBY
from statelog.storage.marks import standby_source

STREAM = Stream(seed=17)
SMALL: dict[str, Any] = {"segment_bytes": 16 << 10}
MANUAL = timedelta(hours=1)


def commit_range(store: statelog.StateStore, start: int, stop: int) -> None:
    for i in range(start, stop):
        assert run_commit(store, STREAM.commit(i)) == i


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` but the lock files, by its digest."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith("LOCK")
    }


def standby_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A source at epoch 29 and a copy whose standby process is gone."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 30)
        compact(src, retain=1, min_tail_bytes=0)
        commit_range(w, 30, 40)
    with statelog.open(copy, follow=src, follow_poll=MANUAL) as sb:
        assert sb.epoch == 39
    assert (copy / STANDBY).is_file()
    return src, copy


def _open(copy: Path) -> None:
    statelog.open(copy).close()


def _compact(copy: Path) -> None:
    compact(copy, min_tail_bytes=0)


def _recover_cli(copy: Path) -> None:
    assert cli_main(["recover", str(copy)]) == 4


WAYS: dict[str, Callable[[Path], None]] = {
    "open": _open,
    "compact": _compact,
    "recover-cli": _recover_cli,
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_copy_that_was_not_promoted_is_never_a_writer(tmp_path: Path, way: str) -> None:
    src, copy = standby_copy(tmp_path)
    before = tree(copy)
    if way == "recover-cli":
        WAYS[way](copy)
    else:
        with pytest.raises(statelog.StandbyCopyError) as err:
            WAYS[way](copy)
        assert str(src) in str(err.value) and "promote" in err.value.hint
    assert tree(copy) == before  # refused before anything was written
    with statelog.open(copy, readonly=True) as ro:  # still readable as it stands
        assert ro.epoch == 39 and store_digest(ro) == STREAM.model(39).digest()


def test_a_running_standby_keeps_writers_out_by_its_lock(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 1, 5)
    with statelog.open(copy, follow=src, follow_poll=MANUAL), pytest.raises(
        statelog.StoreLockedError
    ):
        statelog.open(copy)


def test_promote_without_source_uses_the_one_the_copy_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, copy = standby_copy(tmp_path)
    with statelog.open(src, **SMALL) as w:
        commit_range(w, 40, 45)
    assert cli_main(["promote", str(copy)]) == 0
    assert "at epoch 44" in capsys.readouterr().out
    assert not (copy / STANDBY).exists()
    with statelog.open(copy) as promoted:  # a writer's store now
        assert store_digest(promoted) == STREAM.model(44).digest()
        commit_range(promoted, 45, 47)
    assert cli_main(["promote", str(tmp_path / "src")]) == 3  # names no source
    assert "--source" in capsys.readouterr().err


def test_a_promotion_that_died_after_its_claim_is_finished_by_the_writers_open(
    tmp_path: Path,
) -> None:
    """The claim is durable before the mark goes: the claimed copy is the writer."""
    src, copy = standby_copy(tmp_path)
    claim_source(src, copy, 39)  # the promotion's claim; then its process died
    assert (copy / STANDBY).exists()
    with statelog.open(copy) as w:
        assert w.epoch == 39 and not (copy / STANDBY).exists()
        commit_range(w, 40, 42)
    with pytest.raises(statelog.StorePromotedError):
        statelog.open(src)


def test_a_claim_for_another_copy_does_not_free_this_one(tmp_path: Path) -> None:
    src, copy = standby_copy(tmp_path)
    claim_source(src, tmp_path / "elsewhere", 39)
    with pytest.raises(statelog.StandbyCopyError):
        statelog.open(copy)


def test_a_sharded_standby_root_opens_no_shard_as_a_writer(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.ShardedStore(src, shards=3, **SMALL) as w:
        for i in range(30):
            w.commit(offsets={f"orders-{i % 3}": i}, low_watermark_ms=i, put={f"k{i}": i})
    statelog.ShardedStore(copy, follow=src).close()
    before = tree(copy)
    with pytest.raises(statelog.StatelogError) as err:
        statelog.ShardedStore(copy).close()
    assert "standby" in str(err.value).lower()
    assert tree(copy) == before
    with statelog.ShardedStore(copy, follow=src) as sb:
        sb.promote(1)
    with pytest.raises(statelog.StatelogError):  # shards 0 and 2 are still standbys
        statelog.ShardedStore(copy).close()
    with statelog.ShardedStore(copy, follow=src) as sb:
        sb.promote()
    with statelog.ShardedStore(copy) as promoted:
        assert dict(promoted.items()) == {f"k{i}": i for i in range(30)}


@pytest.mark.parametrize("planted", ["fifo", "garbage", "directory"])
def test_a_planted_standby_mark_is_refused_at_once(tmp_path: Path, planted: str) -> None:
    store = tmp_path / "s"
    with statelog.open(store) as w:
        w.commit(offsets={"p": 1}, low_watermark_ms=0)
    mark = store / STANDBY
    if planted == "fifo":
        os.mkfifo(mark)
    elif planted == "garbage":
        mark.write_bytes(b"\xff" * 100)
    else:
        mark.mkdir()
    with pytest.raises(statelog.StandbyCopyError) as err:
        statelog.open(store)
    assert "cannot be read" in str(err.value)


# -- what a second attack found -------------------------------------------------------------


def _items(s: statelog.StateStore) -> dict[str, Any]:
    return {"epoch": s.epoch, **dict(s.items())}


def test_a_sealed_segment_rewound_and_sealed_again_at_its_length_is_taken(
    tmp_path: Path,
) -> None:
    """Rewound in place, then regrown to the same length and sealed by a clean close: the
    standby takes the source's log, and its promotion keeps the source's commits."""
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.open(src) as w:
        for i in range(1, 61):
            w.commit(offsets={"p": i}, low_watermark_ms=i, put={f"o{i}": i})
    sb = statelog.open(copy, follow=src, follow_poll=MANUAL)
    assert cli_main(["recover", str(src), "--to-epoch", "30"]) == 0
    with statelog.open(src) as w:
        for i in range(31, 61):
            w.commit(offsets={"p": i}, low_watermark_ms=i, put={f"n{i}": i})
    with statelog.open(src, readonly=True) as ro:
        want = _items(ro)
    sb.catch_up()
    assert _items(sb) == want
    assert sb.promote().epoch == 60 and _items(sb) == want
    sb.close()


def test_a_forced_root_promotion_while_its_standby_runs_changes_nothing(tmp_path: Path) -> None:
    src, copy = tmp_path / "src", tmp_path / "copy"
    with statelog.ShardedStore(src, shards=2) as w:
        for i in range(10):
            w.commit(offsets={f"p{i % 2}": i}, low_watermark_ms=i, put={f"k{i}": i})
    running = statelog.ShardedStore(copy, follow=src)
    try:
        before = tree(copy)
        code = cli_main(["promote", str(copy), "--source", str(tmp_path / "gone"), "--force"])
        assert code == 4 and tree(copy) == before  # busy: every mark kept
    finally:
        running.close()
    with pytest.raises(statelog.StatelogError):
        statelog.ShardedStore(copy).close()  # still standbys


def test_the_mark_names_the_source_absolutely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    with statelog.open(site / "primary") as w:
        w.commit(offsets={"p": 1}, low_watermark_ms=0)
    monkeypatch.chdir(site)
    statelog.open("replica", follow="primary", follow_poll=MANUAL).close()
    assert standby_source(site / "replica") == str((site / "primary").resolve())
    monkeypatch.chdir(tmp_path)  # an operator elsewhere
    assert cli_main(["promote", str(site / "replica")]) == 0


def test_a_directory_that_was_promoted_away_is_no_standby_copy(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with statelog.open(a) as w:
        w.commit(offsets={"p": 1}, low_watermark_ms=0)
    with statelog.open(b, follow=a, follow_poll=MANUAL) as sb:
        sb.promote()
    before = tree(a)
    with pytest.raises(statelog.StorePromotedError) as err:
        statelog.open(a, follow=b)
    assert "empty directory" in err.value.hint and tree(a) == before


def test_a_failed_mark_removal_releases_the_copy(tmp_path: Path) -> None:
    src, copy = standby_copy(tmp_path)
    sb = statelog.open(copy, follow=src, follow_poll=MANUAL)
    (copy / STANDBY).unlink()
    (copy / STANDBY).mkdir()  # stands for a copy whose mark cannot be removed (EACCES, EIO)
    with pytest.raises(statelog.StorageError) as err:
        sb.promote()
    assert "finishes the promotion" in err.value.hint
    (copy / STANDBY).rmdir()
    with statelog.open(copy) as w:  # not locked by this process any more
        assert w.epoch == 39
    sb.close()
