"""Memory of this process and scheduling of this thread, from ``/proc`` (Linux).

``RssAnon`` is the resident anonymous memory: the Python heap, dicts, the
overlay. ``RssFile`` is resident file-backed memory: a memory-mapped LMDB
base counts there, not in ``RssAnon``, and the kernel can drop it under
pressure. Issue 3's memory target is stated on ``RssAnon``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["rss", "rss_anon", "thread_schedstat"]

_STATUS = Path("/proc/self/status")
_SCHEDSTAT = "/proc/thread-self/schedstat"


def rss() -> dict[str, int]:
    """``VmRSS``, ``RssAnon``, ``RssFile``, ``RssShmem`` and ``VmHWM`` in bytes (absent: 0)."""
    out = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "RssShmem": 0, "VmHWM": 0}
    try:
        text = _STATUS.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in out:
            fields = rest.split()
            if fields and fields[-1] == "kB":
                out[name] = int(fields[0]) * 1024
    return out


def rss_anon() -> int:
    """Resident anonymous memory of this process in bytes (0 where /proc is missing)."""
    return rss()["RssAnon"]


def thread_schedstat() -> tuple[float, float]:
    """Seconds this thread has run on a CPU and waited on a run queue (for a core).

    From ``/proc/thread-self/schedstat``; (0, 0) where it is missing. Over a
    span, wall time minus both is time the thread was blocked: in a system
    call such as ``fdatasync``, or asleep waiting for a lock (the GIL).
    """
    try:
        with open(_SCHEDSTAT, "rb") as fh:
            fields = fh.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0
