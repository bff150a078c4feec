"""Shared fixtures: a fresh store directory per test."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """A path where no store exists yet."""
    return tmp_path / "store"
