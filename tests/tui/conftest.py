"""Fixtures of the app's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localfab.tui.previews import detect


@pytest.fixture
def halfcell() -> Iterator[None]:
    """Pictures of images drawn in coloured half cells (what any true-colour terminal shows;
    the app asks the terminal at start, which a test cannot)."""
    assert detect("halfcell") == "halfcell"
    yield
    detect("off")
