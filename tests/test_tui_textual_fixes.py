"""The workarounds for Textual bugs in `localfab.tui.textual_fixes` are in place, and do what
they are for; these fail loudly when Textual changes under them."""

from __future__ import annotations

import gc
import weakref

from textual._styles_cache import StylesCache
from textual.color import Color

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
