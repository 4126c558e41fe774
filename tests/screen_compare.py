"""Screens compared in tests: settled by a deadline, and a short message when they differ.

pytest explains a failed `==` between two strings with a diff whose cost grows with the square
of their length: for the screenshots of a tall screen it runs for many minutes (under xdist the
worker is lost). The first differing line says enough.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from textual.pilot import Pilot

T = TypeVar("T")

SHOWN = 300  # characters of a differing line in the message


def first_difference(actual: str, expected: str) -> str | None:
    """Where `actual` first differs from `expected`, in words; None when they are equal."""
    if actual == expected:
        return None
    got, want = actual.splitlines(), expected.splitlines()
    for number, (a, b) in enumerate(zip(got, want, strict=False), 1):
        if a != b:
            return f"line {number}:\n  got      {a[:SHOWN]}\n  expected {b[:SHOWN]}"
    return f"length: {len(got)} lines, expected {len(want)}"


def assert_same_screen(actual: str, expected: str, what: str = "the screen") -> None:
    """Fail, briefly, unless the two screenshots are the same."""
    difference = first_difference(actual, expected)
    if difference is not None:
        pytest.fail(f"{what} differs from the fresh render at {difference}", pytrace=False)


async def settled(
    pilot: Pilot[Any], probe: Callable[[], T], expected: T, *, seconds: float = 20
) -> T:
    """What `probe()` gives once it equals `expected`, or when `seconds` have passed.

    A deadline, not a fixed wait: `pilot.pause()` alone may return before the app is done (it
    takes a starved process for an idle one), and a parked segment that comes into view is
    turned back into Markdown a few messages later.
    """
    deadline = time.monotonic() + seconds
    value = probe()
    while value != expected and time.monotonic() < deadline:
        await pilot.pause(0.02)
        value = probe()
    return value


async def steady(pilot: Pilot[Any], probe: Callable[[], T], *, seconds: float = 20) -> T:
    """What `probe()` gives once it stops changing: the same twice, with the app's pending
    messages handled and a few paints in between (within `seconds`)."""
    deadline = time.monotonic() + seconds
    await pilot.pause()
    last = probe()
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        now = probe()
        if now == last:
            break
        last = now
    return last
