"""What every integration shares: the engine version gate."""

from __future__ import annotations

import importlib.metadata
import re

from statelog.errors import IntegrationError

__all__ = ["require", "version_tuple"]


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading numeric release of ``version`` ("3.28.1rc1" is (3, 28, 1)).

    :raises IntegrationError: the string does not start with a release number.
    """
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise IntegrationError(f"cannot read a release number from version {version!r}")
    return tuple(int(part) for part in match.group(0).split("."))


def require(
    distribution: str,
    version: str | None,
    *,
    at_least: tuple[int, ...],
    below: tuple[int, ...],
    extra: str,
) -> tuple[int, ...]:
    """Check that ``distribution`` is installed in ``[at_least, below)`` and return its release.

    ``version`` is the engine's own ``__version__`` where it has one; the
    installed distribution's metadata is read otherwise.

    :raises IntegrationError: the engine is missing or outside the range, with a hint
        naming the extra that installs a supported version.
    """
    if version is None:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            raise IntegrationError(
                f"{distribution} is not installed",
                hint=f"pip install 'statelog[{extra}]'",
            ) from None
    release = version_tuple(version)
    if not at_least <= release < below:
        supported = f">={_dotted(at_least)},<{_dotted(below)}"
        raise IntegrationError(
            f"{distribution} {version} is outside the range statelog's {extra} store "
            f"supports ({supported})",
            hint=f"pip install 'statelog[{extra}]' installs {distribution}{supported}",
        )
    return release


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in release)
