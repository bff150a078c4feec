"""``statelog dump STORE``: the keys and values of a store, read-only.

Reads through a read-only open (the recovered state, exactly what a
writer opening now would see). Plain output is one line per key,
``table<TAB>key<TAB>value`` with key and value as JSON (a bytes key or
value is written as ``{"bytes": "<hex>"}``). ``--json`` writes one JSON
object per line (``table``, ``key``, ``value``), so a large store streams.

Damage in the log (a checksum mismatch, or a record that verifies but
breaks the record schema) does not stop it: the recovered state is the
last good commit's. A stored value that does not decode (damage past
every check) raises ``CorruptionError``: exit 1, after the lines before it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from statelog.cli.exits import EXIT_OK
from statelog.errors import InvalidOptionError
from statelog.store.store import open as open_store

__all__ = ["add_parser", "jsonable", "run"]


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Register ``dump`` on the subcommand parsers ``sub``."""
    p = sub.add_parser(
        "dump",
        parents=parents,
        help="print keys and values (read-only)",
        description="Print the keys and values of the recovered state, in key order "
        "(bytes keys before str keys). Read-only. Exit 0 (damage in the log: the state it "
        "recovers to, as a read-only open sees it); 1 if a stored value does not decode "
        "(run `statelog verify`); 3 for an unknown --table.",
    )
    p.add_argument("store", type=Path, metavar="STORE", help="the store directory")
    p.add_argument("--table", metavar="T", help="only this table (default: every table)")
    p.add_argument(
        "--prefix", metavar="P", help="only str keys that start with P (bytes keys: --bytes-prefix)"
    )
    p.add_argument(
        "--bytes-prefix", metavar="HEX", help="only bytes keys that start with these hex bytes"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def jsonable(v: Any) -> Any:
    """``v`` with every ``bytes`` replaced by ``{"bytes": hex}`` (JSON has no bytes)."""
    if isinstance(v, bytes | bytearray | memoryview):
        return {"bytes": bytes(v).hex()}
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [jsonable(x) for x in v]
    return v


def run(args: argparse.Namespace) -> int:
    """Print the (filtered) contents of ``args.store``; return the exit status."""
    prefix: str | bytes | None = args.prefix
    if args.bytes_prefix is not None:
        if prefix is not None:
            raise InvalidOptionError("--prefix and --bytes-prefix", hint="give one of them")
        try:
            prefix = bytes.fromhex(args.bytes_prefix)
        except ValueError:
            raise InvalidOptionError(
                f"--bytes-prefix {args.bytes_prefix!r}", hint="give hex digits, e.g. 6b31"
            ) from None
    with open_store(args.store, readonly=True) as ro:
        tables = ro.tables()
        if args.table is not None:
            if args.table not in tables:
                raise InvalidOptionError(
                    f"--table {args.table!r}: no such table in {args.store}",
                    hint=f"tables: {', '.join(tables) or 'none'}",
                )
            tables = [args.table]
        for table in tables:
            for key, value in ro.items(table, prefix):
                k, v = jsonable(key), jsonable(value)
                if args.json:
                    print(json.dumps({"table": table, "key": k, "value": v}))
                else:
                    print(f"{table}\t{json.dumps(k)}\t{json.dumps(v)}")
    return EXIT_OK
