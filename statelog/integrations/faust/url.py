"""The ``statelog://`` store URL of a Faust table, read into typed, checked options.

``statelog:///var/lib/app/tables?durability=group`` (an absolute directory),
``statelog://tables`` (relative to the app's ``tabledir``), or ``statelog://``
(the ``tabledir`` itself). Options:

| option        | values                      | default   |
|---------------|-----------------------------|-----------|
| `durability`  | `commit`, `group`, `none`   | `group`   |
| `group_delay` | milliseconds: `5`, `5ms`    | 10 ms     |
| `compactor`   | `none`, `thread`, `process` | `thread`  |

Group commit is the default because Faust writes the store once per event
(each table write is one statelog commit): `group` syncs them in the
background within `group_delay`, where `commit` would fsync every event.
The delay is 10 ms here (2 ms for `statelog.open`): a background sync every
2 ms cost a Faust worker about a fifth of its events/s (measured), and a
power cut loses at most the last `group_delay` of writes, which Faust
replays from the changelog.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from statelog.errors import IntegrationError, StatelogError
from statelog.store.options import StoreOptions

__all__ = ["StoreURL", "parse_store_url"]

_CHOICES = {
    "durability": ("commit", "group", "none"),
    "compactor": ("none", "thread", "process"),
}
_HINT = "statelog:///dir?durability=group|commit|none&group_delay=5ms&compactor=process|thread|none"


@dataclass(frozen=True)
class StoreURL:
    """Where a table's stores live and how they are opened."""

    directory: Path | None
    """Absolute, or relative to the app's ``tabledir``; None: the ``tabledir`` itself."""
    options: StoreOptions

    def base(self, tabledir: Path) -> Path:
        if self.directory is None:
            return tabledir
        return self.directory if self.directory.is_absolute() else tabledir / self.directory


def parse_store_url(url: str) -> StoreURL:
    """Read a ``statelog://`` URL (module docstring). Nothing is touched on disk.

    :raises IntegrationError: another scheme, an unknown option, a repeated
        option or a bad value, with a hint listing the options.
    """
    parts = urlsplit(str(url))
    if parts.scheme != "statelog" or parts.fragment:
        raise IntegrationError(f"{url}: not a statelog:// store URL", hint=_HINT)
    location = unquote(parts.netloc + parts.path)
    directory = Path(location) if location.strip("/") else None
    given: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name in given:
            raise IntegrationError(f"{url}: option {name!r} given twice", hint=_HINT)
        given[name] = value
    durability, compactor, delay = "group", "thread", timedelta(milliseconds=10)
    for name, value in given.items():
        if name in _CHOICES:
            if value not in _CHOICES[name]:
                raise IntegrationError(
                    f"{url}: {name}={value!r} is not one of {', '.join(_CHOICES[name])}",
                    hint=_HINT,
                )
            if name == "durability":
                durability = value
            else:
                compactor = value
        elif name == "group_delay":
            delay = _milliseconds(url, value)
        else:
            raise IntegrationError(f"{url}: unknown option {name!r}", hint=_HINT)
    try:
        options = StoreOptions(
            durability=durability,  # type: ignore[arg-type]  # checked against _CHOICES
            group_delay=delay,
            compactor=compactor,  # type: ignore[arg-type]
        )
    except StatelogError as exc:
        raise IntegrationError(f"{url}: {exc.message}", hint=_HINT) from exc
    return StoreURL(directory, options)


def _milliseconds(url: str, value: str) -> timedelta:
    text = value[:-2] if value.endswith("ms") else value
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 0 < ms <= 60_000:
        raise IntegrationError(
            f"{url}: group_delay={value!r} is not a number of milliseconds in (0, 60000]",
            hint=_HINT,
        )
    return timedelta(milliseconds=ms)
