"""Structured log lines: ``ts=... level=... event=... store=... key=value``.

Every compactor record is logged as ``log.info("%s", kv(event=..., store=...))``
so a line is one ``key=value`` list that ``grep`` and log shippers split on
spaces. A value holding a space, a quote, ``=`` or nothing at all is written
as a JSON string; everything else is written bare.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

__all__ = ["LOGGER", "KeyValueFormatter", "kv", "value"]

LOGGER = "statelog.compactor"


def value(v: object) -> str:
    """One value of a ``key=value`` pair."""
    if isinstance(v, float):
        text = f"{v:.3f}"
    elif isinstance(v, Path):
        text = str(v)
    elif v is None:
        text = "-"
    else:
        text = str(v)
    if not text or any(c in text for c in ' "=\n\t\\'):
        return json.dumps(text)
    return text


def kv(**fields: object) -> str:
    """``key=value`` pairs in the order given (``event`` first by convention)."""
    return " ".join(f"{k}={value(v)}" for k, v in fields.items())


class KeyValueFormatter(logging.Formatter):
    """Prefix each record with ``ts=`` (UTC, milliseconds) and ``level=``.

    A message that is not already ``key=value`` (from a library logger) is
    quoted as ``msg=``; an exception's traceback goes into ``exc=`` on the
    same line, so a line is always one record.
    """

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ts = f"{stamp}.{int(record.msecs):03d}Z"
        msg = record.getMessage()
        head = msg.split(" ", 1)[0]
        body = msg if "=" in head else kv(msg=msg)
        line = f"ts={ts} level={record.levelname} {body}"
        if record.name != LOGGER:
            line += f" logger={record.name}"
        if record.exc_info:
            line += " exc=" + value(self.formatException(record.exc_info))
        return line
