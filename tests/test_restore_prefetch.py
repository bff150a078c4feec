"""A restore downloads segments ahead of its checks, and what it fetched for nothing never
reaches the copy.

| case                                              | the restored copy holds                    |
|---------------------------------------------------|--------------------------------------------|
| every segment good                                | all of them; downloads ran in the threads  |
| a segment in the middle damaged                   | the segments before it, none after it      |
| a segment after the damaged one missing           | the same: its error was never asked for    |
| restored to an epoch                              | no segment after the one holding the epoch |
|                                                   | (none after it is even downloaded)         |

And :class:`Prefetch` itself, against a staging stand-in:

| case                                              | what must hold                             |
|---------------------------------------------------|--------------------------------------------|
| interrupted while downloads run                   | those finish and are removed, the queued   |
|                                                   | ones never start, no thread is left        |
| an unused segment cannot be removed               | OSError (unless the restore fails anyway)  |
| two entries name one local file                   | nothing fetched ahead                      |
| no thread can be started                          | fetched in the caller's thread             |
| the second thread cannot be started (the pool     | nothing left behind; from then on each is  |
| queued its download already)                      | fetched once, in the caller's thread; a    |
|                                                   | restore is exact, or stops at the damage   |
| interrupted inside the pool's shutdown, after it  | close() returns: no download is waited for |
| took a queued download off its queue              | forever                                    |

And a download finding a temp file of its name already there refuses, and leaves that
file as it is.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from statelog.remote import restore, ship
from statelog.remote import staging as staging_mod
from statelog.remote.entry import Entry
from statelog.remote.prefetch import Prefetch
from tests.helpers import flip_bit
from tests.test_remote import commit_range, state_of

pytestmark = pytest.mark.timeout(120)


def _shipped(tmp_path: Path) -> tuple[str, Path, list[Path]]:
    """A store of 300 commits shipped to a directory: its url, and the segment objects in
    log order (no snapshot: the restore replays every one)."""
    url, src = f"file://{tmp_path / 'replica'}", tmp_path / "src"
    commit_range(src, 0, 300)
    ship(src, url)
    objects = sorted((tmp_path / "replica").rglob("*.wal"), key=lambda p: p.name)
    assert len(objects) >= 6, objects
    return url, src, objects


def _segments(dest: Path) -> list[str]:
    return sorted(p.name for p in (dest / "wal").iterdir())


def _downloads(monkeypatch: pytest.MonkeyPatch, slow: str = "") -> list[tuple[str, str]]:
    """Record each download's segment and thread; the one named ``slow`` takes 0.3 s longer
    (the other thread then surely starts the segments after it)."""
    seen: list[tuple[str, str]] = []
    real = staging_mod.download

    def spied(client: Any, root: Any, files: Any, e: Any) -> Path:
        seen.append((e.name, threading.current_thread().name))
        if e.name == slow:
            time.sleep(0.3)
        return real(client, root, files, e)

    monkeypatch.setattr(staging_mod, "download", spied)
    return seen


def test_every_segment_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, src, objects = _shipped(tmp_path)
    seen = _downloads(monkeypatch)
    got = restore(url, tmp_path / "dst")
    assert got.epoch == 300 and state_of(tmp_path / "dst") == state_of(src)
    assert _segments(tmp_path / "dst") == [p.name for p in objects]
    wal = [(n, t) for n, t in seen if n.endswith(".wal")]
    assert wal and all(t.startswith("statelog-fetch") for _n, t in wal), wal


@pytest.mark.parametrize("also", ["nothing", "the next one missing"])
def test_a_damaged_segment_leaves_none_after_it(
    tmp_path: Path, also: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _src, objects = _shipped(tmp_path)
    bad = len(objects) // 2
    flip_bit(objects[bad], objects[bad].stat().st_size // 2)
    if also == "the next one missing":
        objects[bad + 1].unlink()
    seen = _downloads(monkeypatch, slow=objects[bad].name)
    got = restore(url, tmp_path / "dst")
    assert got.epoch < 300 and got.lost_epochs
    assert _segments(tmp_path / "dst") == [p.name for p in objects[:bad]]
    ahead = {n for n, _t in seen} & {p.name for p in objects[bad + 1 :]}
    assert ahead, seen  # fetched ahead, then removed
    assert not list((tmp_path / "dst" / "wal").glob("*.tmp"))


def test_a_restore_to_an_epoch_leaves_no_later_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _src, objects = _shipped(tmp_path)
    seen = _downloads(monkeypatch)
    got = restore(url, tmp_path / "dst", upto=40)
    assert got.epoch == 40
    names = _segments(tmp_path / "dst")
    last_first_lsn = int(names[-1].split("-")[1].split(".")[0], 16)
    assert last_first_lsn <= 40
    assert names == [p.name for p in objects[: len(names)]]
    assert {n for n, _t in seen if n.endswith(".wal")} == set(names)


class _Staging:
    """What Prefetch uses of a Staging: ``path_of``, ``fetch`` (slow), ``remove``."""

    def __init__(self, root: Path, *, fail_remove: bool = False) -> None:
        self.root, self.fail_remove = root, fail_remove
        self.fetched: list[tuple[str, str]] = []
        self.removed: list[str] = []

    def path_of(self, e: Entry) -> Path:
        return self.root / e.name

    def fetch(self, e: Entry) -> Path:
        self.fetched.append((e.key, threading.current_thread().name))
        time.sleep(0.3)
        self.path_of(e).write_bytes(b"x")
        return self.path_of(e)

    def remove(self, e: Entry) -> None:
        if self.fail_remove:
            raise OSError(5, "Input/output error")
        self.removed.append(e.key)
        self.path_of(e).unlink(missing_ok=True)


def _entries(n: int, *, names: list[str] | None = None) -> list[Entry]:
    names = names or [f"{i:016x}.wal" for i in range(n)]
    return [Entry(key=f"g/{i}", kind="wal", name=names[i], sha256="", size=1, generation=1)
            for i in range(n)]  # fmt: skip


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("statelog-fetch")}


def test_an_interrupt_waits_for_the_downloads_under_way_and_starts_no_other(
    tmp_path: Path,
) -> None:
    st, es = _Staging(tmp_path), _entries(6)
    with pytest.raises(KeyboardInterrupt), Prefetch(st, es) as ahead:  # type: ignore[arg-type]
        ahead.fetch(es[0])  # 0, 1, 2 submitted; 0 and 1 ran at once, 2 may have started
        raise KeyboardInterrupt
    fetched = {k for k, _t in st.fetched}
    assert fetched in ({"g/0", "g/1"}, {"g/0", "g/1", "g/2"}), st.fetched
    assert sorted(st.removed) == sorted(fetched - {"g/0"})
    assert [p.name for p in tmp_path.iterdir()] == [es[0].name]  # each waited for, then removed
    assert not _threads()


@pytest.mark.parametrize("failing", [False, True])
def test_an_unused_segment_that_cannot_be_removed(tmp_path: Path, failing: bool) -> None:
    st, es = _Staging(tmp_path, fail_remove=True), _entries(3)
    ahead = Prefetch(st, es)  # type: ignore[arg-type]
    ahead.fetch(es[0])
    if failing:
        ahead.close(failing=True)  # the restore's own error is the one raised
    else:
        with pytest.raises(OSError):
            ahead.close()


def test_two_entries_of_one_local_file_are_not_fetched_ahead(tmp_path: Path) -> None:
    st = _Staging(tmp_path)
    es = _entries(3, names=["a.wal", "b.wal", "a.wal"])
    with Prefetch(st, es) as ahead:  # type: ignore[arg-type]
        ahead.fetch(es[0])
    assert st.fetched == [("g/0", "MainThread")] and not st.removed


def test_without_a_thread_it_fetches_in_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_thread(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(ThreadPoolExecutor, "submit", no_thread)
    st, es = _Staging(tmp_path), _entries(3)
    with Prefetch(st, es) as ahead:  # type: ignore[arg-type]
        for e in es:
            ahead.fetch(e)
    assert st.fetched == [(e.key, "MainThread") for e in es]


# -- a second thread that cannot be started ---------------------------------------------


def _second_fetch_thread_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's second thread fails to start: the pool has queued its download already."""
    real = threading.Thread.start
    starts = []

    def start(self: threading.Thread) -> None:
        if self.name.startswith("statelog-fetch"):
            starts.append(self.name)
            if len(starts) == 2:
                raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)


def test_a_download_queued_by_a_failed_start_is_never_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _second_fetch_thread_fails(monkeypatch)
    st, es = _Staging(tmp_path), _entries(4)
    with Prefetch(st, es) as ahead:  # type: ignore[arg-type]
        ahead.fetch(es[0])  # the restore stops here (its check refused es[0], say)
    assert [p.name for p in tmp_path.iterdir()] == [es[0].name]
    assert not _threads()


def test_after_a_failed_start_each_segment_is_fetched_once_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _second_fetch_thread_fails(monkeypatch)
    st, es = _Staging(tmp_path), _entries(4)
    with Prefetch(st, es) as ahead:  # type: ignore[arg-type]
        for e in es:
            assert ahead.fetch(e) == tmp_path / e.name
    assert sorted(p.name for p in tmp_path.iterdir()) == [e.name for e in es]
    assert not _threads()


@pytest.mark.parametrize("damaged", [None, 0])
def test_a_restore_whose_second_thread_fails_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: int | None
) -> None:
    url, src, objects = _shipped(tmp_path)
    if damaged is not None:
        flip_bit(objects[damaged], objects[damaged].stat().st_size // 2)
    _second_fetch_thread_fails(monkeypatch)
    seen = _downloads(monkeypatch, slow=objects[0].name)  # the queued one surely runs
    got = restore(url, tmp_path / "dst", check=False)
    if damaged is None:
        assert got.epoch == 300 and state_of(tmp_path / "dst") == state_of(src)
        assert _segments(tmp_path / "dst") == [p.name for p in objects]
    else:
        assert got.epoch == 0 and _segments(tmp_path / "dst") == []
    assert seen and not list((tmp_path / "dst" / "wal").glob("*.tmp"))


def test_an_interrupted_shutdown_leaves_no_download_neither_run_nor_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt inside the pool's shutdown, after it took a queued download off its
    queue and before it cancelled it: that download must not be waited for forever."""
    real = ThreadPoolExecutor.shutdown
    calls = []

    def interrupted(self: ThreadPoolExecutor, *a: Any, **kw: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            self._work_queue.get_nowait()  # type: ignore[attr-defined]
            raise KeyboardInterrupt
        real(self, *a, **kw)

    monkeypatch.setattr(ThreadPoolExecutor, "shutdown", interrupted)
    st, es = _Staging(tmp_path), _entries(6)
    done = threading.Event()

    def run() -> None:
        with pytest.raises(KeyboardInterrupt), Prefetch(st, es, ahead=4) as ahead:  # type: ignore[arg-type]
            ahead.fetch(es[0])  # 1 and 2 under way, 3 and 4 queued behind them
            raise RuntimeError("the restore failed")
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert done.wait(10), "close() waits for a download that will never run"
    assert [p.name for p in tmp_path.iterdir()] == [es[0].name]


def test_a_download_removes_only_the_files_it_made(tmp_path: Path) -> None:
    """A temp file already there (another download of the same name, a bug) is refused,
    and left as it is."""
    url, src, _objects = _shipped(tmp_path)
    from statelog.remote import RemoteClient
    from statelog.remote.checks import Confined
    from statelog.remote.manifest import read_manifest
    from statelog.storage.fileio import FileLayer
    from statelog.storage.layout import StoreLayout

    client = RemoteClient.from_url(url)
    versioned = read_manifest(client, StoreLayout(src).read_identity(FileLayer()))
    assert versioned is not None
    e = next(x for x in versioned.manifest.objects if x.kind == "wal")
    root = tmp_path / "staging"
    (root / "wal").mkdir(parents=True)
    (root / "snapshots").mkdir()
    theirs = root / "wal" / (e.name + (".obj.tmp" if e.encoding else ".tmp"))
    theirs.write_bytes(b"another download's")
    with pytest.raises(FileExistsError):
        staging_mod.download(client, Confined(root), FileLayer(), e)
    assert theirs.read_bytes() == b"another download's"
