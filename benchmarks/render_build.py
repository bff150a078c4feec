"""The report's section on building the base image from a snapshot (``bench_snapshot_build.py``).

Every number comes from the suites ``snapshot-build`` and ``snapshot-restore``
of the results; without them the section is empty.
"""

from __future__ import annotations

from statistics import median

from .conftest import size_id
from .render_text import Doc, ratio, size, suite, table

__all__ = ["build_section"]

KINDS = {
    "format1": "(a) format 1: extract (decompress the image), open, one read",
    "format2": "(b) format 2: extract (parse, check, build), open, one read",
    "verify": "(c) format 2: verify only (parse, check)",
}


def _row(r: Doc) -> str:
    s, built = r["seconds"], r.get("built_image_bytes")
    return (
        f"{size_id(r['keys'])} | {KINDS.get(r['kind'], r['kind'])} | {median(s):.3f} | "
        f"{min(s):.3f}-{max(s):.3f} | {median(r['cpu_seconds']):.3f} | "
        f"{size(r['snapshot_read_bytes'])} | {'-' if built is None else size(built)}"
    )


def _size_row(keys: int, by: dict[str, Doc]) -> str:
    r = next(iter(by.values()))
    a, b = by.get("format1"), by.get("format2")
    wall = cpu = "-"
    if a is not None and b is not None:
        wall = f"{ratio(median(b['seconds']), median(a['seconds'])):.2f}x"
        cpu = f"{ratio(median(b['cpu_seconds']), median(a['cpu_seconds'])):.2f}x"
    return (
        f"{size_id(keys)} | {r['value_bytes'] / keys:.0f} B | {size(r['image_bytes'])} | "
        f"{size(r['snapshot_bytes_v1'])} | {size(r['snapshot_bytes_v2'])} | "
        f"{size(r['body_bytes_v2'])} | {wall} | {cpu}"
    )


def _restore_rows(runs: list[Doc]) -> list[str]:
    return [
        f"{size_id(r['keys'])} | {size(r['snapshot_bytes'])} | {r['bytes_shipped']:,} | "
        f"{median(r['seconds']):.3f} | {min(r['seconds']):.3f}-{max(r['seconds']):.3f} | "
        f"{median(r['restore_seconds']):.3f} | {median(r['open_seconds']):.3f}"
        for r in sorted(runs, key=lambda r: r["keys"])
    ]


def build_section(doc: Doc) -> list[str]:
    runs = sorted(
        suite(doc, "snapshot-build"), key=lambda r: (r["keys"], list(KINDS).index(r["kind"]))
    )
    restores = suite(doc, "snapshot-restore")
    if not runs and not restores:
        return []
    out = ["## Building the base image from a snapshot"]
    if runs:
        by_keys: dict[int, dict[str, Doc]] = {}
        for r in runs:
            by_keys.setdefault(r["keys"], {})[r["kind"]] = r
        out += [
            "The same state (the workload's records, msgpack values) as a format-1 snapshot "
            "(body: the zstd-compressed LMDB image) and a format-2 one (body: the "
            "zstd-compressed record stream), both zstd level 3, each path run "
            f"{len(runs[0]['seconds'])} time(s) in the benchmark process with the snapshot in "
            "the page cache; CPU s is `time.process_time` (all threads).",
            table(
                "keys | measured | median s | range s | CPU s | snapshot read | image built",
                map(_row, runs),
                "rlrrrrr",
            ),
            table(
                "keys | value (mean) | image (set-up) | format-1 snapshot | format-2 snapshot "
                "| format-2 stream | (b)/(a) median s | (b)/(a) CPU s",
                (_size_row(k, by) for k, by in by_keys.items()),
                "r" * 8,
            ),
        ]
    if restores:
        out += [
            "(d) Restore of a store of that many keys (one snapshot) from moto's S3 server on "
            "loopback, then the first writer open of the restored directory and one read, "
            f"{len(restores[0]['seconds'])} time(s).",
            table(
                "keys | snapshot | bytes shipped | restore + open median s | range s "
                "| restore s | open + read s",
                _restore_rows(restores),
                "r" * 7,
            ),
        ]
    return out
