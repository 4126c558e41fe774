"""The workarounds for Textual bugs in `localfab.tui.textual_fixes` are in place, and do what
they are for; these fail loudly when Textual changes under them."""

from __future__ import annotations

import gc
import weakref

import pytest
from textual._styles_cache import StylesCache
from textual.app import App, ComposeResult
from textual.color import Color
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static

from localfab.tui import (
    app,  # noqa: F401  (importing the app applies the fixes)
    textual_fixes,
)


def test_the_style_cache_fix_is_applied_to_the_shape_it_was_written_for() -> None:
    # If this fails, Textual changed `StylesCache.get_inner_outer`: see whether
    # Textualize/textual#6665 is fixed (then drop the fix) or how the method looks now.
    assert isinstance(StylesCache.__dict__["get_inner_outer"], staticmethod)
    assert textual_fixes.fix_styles_cache() is False  # applied once, at import


def test_a_widgets_style_cache_is_freed_after_it_painted() -> None:
    cache = StylesCache()
    base, background = Color(10, 20, 30), Color(200, 100, 50, 0.5)
    inner, outer = cache.get_inner_outer(base, background)
    assert inner != outer  # the inner background is blended over the outer
    assert cache.get_inner_outer(base, background) == (inner, outer)  # still cached
    gone = weakref.ref(cache)
    del cache
    gc.collect()
    assert gone() is None  # Textual's own cache kept up to 1,024 of these, with their lines


def test_the_relayout_fix_is_applied_to_the_shape_it_was_written_for() -> None:
    # If this fails, Textual changed `Widget._size_updated`: see how it sets `virtual_size` now.
    assert getattr(Widget.__dict__["_size_updated"], "localfab_fix", False)
    assert textual_fixes.fix_relayout_after_layout() is False  # applied once, at import


class _Growing(App[None]):
    CSS = "#box { height: 8; overflow: hidden hidden; } #text { height: auto; }"

    def compose(self) -> ComposeResult:
        with Vertical(id="box"):
            yield Static("one line", id="text")
        with VerticalScroll(id="log"):
            yield Static("\n".join(f"line {i}" for i in range(20)))


async def _layouts_after_growing(growing: _Growing) -> tuple[int, int, bool]:
    """Layout passes after a text in a box that cannot scroll grows to 41 lines; its height;
    whether the log beside it still scrolls."""
    count = 0
    original = Screen._refresh_layout

    def counted(screen: Screen[None], *args: object, **kwargs: object) -> None:
        nonlocal count
        count += 1
        original(screen, *args, **kwargs)  # type: ignore[arg-type]

    async with growing.run_test(size=(40, 20)) as pilot:
        await pilot.pause()
        Screen._refresh_layout = counted  # type: ignore[method-assign]
        try:
            growing.query_one("#text", Static).update("\n".join(f"line {i}" for i in range(41)))
            for _ in range(5):
                await pilot.pause(0.05)
        finally:
            Screen._refresh_layout = original  # type: ignore[method-assign]
        log = growing.query_one("#log", VerticalScroll)
        return count, growing.query_one("#text").size.height, log.max_scroll_y > 0


@pytest.mark.anyio
async def test_a_growing_widget_that_cannot_scroll_is_laid_out_once() -> None:
    fixed = Widget.__dict__["_size_updated"]
    Widget._size_updated = fixed.original  # type: ignore[method-assign]
    try:
        before = await _layouts_after_growing(_Growing())
    finally:
        Widget._size_updated = fixed  # type: ignore[method-assign]
    after = await _layouts_after_growing(_Growing())
    # Textual's own code lays the screen out a second time for nothing; if it stops doing so,
    # drop the fix.
    assert (before[0], after[0]) == (2, 1)
    assert after[1:] == before[1:] == (41, True)  # the same layout, and the log still scrolls
