"""Workarounds for known Textual bugs, in one place; `tests/tui/test_textual_fixes.py` fails
loudly when the library changes under them.

- `StylesCache.get_inner_outer` (textual 8.x) is an `lru_cache` on an instance method, so its 1,024
  cache entries hold 1,024 widgets' style caches alive, with every rendered line in them
  (Textualize/textual#6665, open). In a chat whose messages are mounted and removed, that kept
  tens of thousands of dead objects reachable, and every garbage-collector pass walked them. The
  method never uses its instance; here the cache is keyed by its two colours only.
- After a layout pass, `Screen._refresh_layout` gives every widget its new size through
  `Widget._size_updated`, which sets the `virtual_size` reactive; that reactive asks for another
  layout of the whole screen (textual 8.x). For a widget that cannot scroll (both overflows
  hidden), a new virtual size changes no scrollbar, so that second pass lays out what the first
  one just did: a streaming reply paid for two layouts per frame. Such widgets now take their
  virtual size without the request; widgets that can scroll keep it.
- Text reaches the terminal with its control characters: Rich drops only BEL, BS, VT, FF and CR,
  so an ESC or a C1 control (U+009B, CSI) in any drawn text (a chat title, a notice, a file name,
  model output) writes an escape sequence of its own (the terminal's title, its clipboard, a
  cleared screen). Every line the screen draws (`Strip.render`, the compositor's one way out) now
  drops them from its text before styling it; they have no width, so no line changes length.
  Message text shows them as visible stand-ins before this (localfab.textsafe).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from rich.segment import Segment
from textual._styles_cache import StylesCache
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from localfab.textsafe import has_controls, strip_controls


def _is_instance_keyed_cache(method: object) -> bool:
    return isinstance(method, functools._lru_cache_wrapper) and hasattr(method, "__wrapped__")


def fix_styles_cache() -> bool:
    """Key `get_inner_outer`'s cache by its colours only. Returns whether it changed anything
    (False once applied, or when this Textual no longer has the bug's shape)."""
    method = StylesCache.__dict__.get("get_inner_outer")
    if not _is_instance_keyed_cache(method):
        return False
    body = method.__wrapped__  # type: ignore[union-attr]

    @functools.lru_cache(1024)
    def get_inner_outer(base_background: Any, background: Any) -> Any:
        return body(StylesCache, base_background, background)  # the body ignores its first

    StylesCache.get_inner_outer = staticmethod(get_inner_outer)  # type: ignore[assignment,method-assign]
    return True


def _sizes_without_relayout(original: Any) -> Any:
    def _size_updated(
        self: Widget, size: Size, virtual_size: Size, container_size: Size, layout: bool = True
    ) -> bool:
        if layout and self.styles.overflow_x == "hidden" and self.styles.overflow_y == "hidden":
            layout = False  # no scrollbar to show or hide: the pass that called this is enough
        return bool(original(self, size, virtual_size, container_size, layout))

    _size_updated.localfab_fix = True  # type: ignore[attr-defined]
    _size_updated.original = original  # type: ignore[attr-defined]
    return _size_updated


def fix_relayout_after_layout() -> bool:
    """Layouts stop asking for a second one for widgets that cannot scroll. Returns whether it
    changed anything (False once applied, or when Textual's `_size_updated` changed shape)."""
    original = Widget.__dict__.get("_size_updated")
    if original is None or getattr(original, "localfab_fix", False):
        return False
    if list(inspect.signature(original).parameters) != [
        "self",
        "size",
        "virtual_size",
        "container_size",
        "layout",
    ]:
        return False
    Widget._size_updated = _sizes_without_relayout(original)  # type: ignore[method-assign]
    return True


def _render_without_controls(original: Any) -> Any:
    def render(self: Strip, console: Any) -> str:
        if self._render_cache is None:
            segments = self._segments
            text = "".join([seg.text for seg in segments])
            # isprintable() is one quick pass; only text it flags is searched for controls.
            if not text.isprintable() and has_controls(text):
                self._segments = [
                    Segment(strip_controls(text), style, control) if control is None else seg
                    for seg in segments
                    for text, style, control in (seg,)
                ]
        return str(original(self, console))

    render.localfab_fix = True  # type: ignore[attr-defined]
    render.original = original  # type: ignore[attr-defined]
    return render


def fix_controls_in_strips() -> bool:
    """Lines drawn to the terminal carry no control character of their text. Returns whether it
    changed anything (False once applied, or when Textual's `Strip.render` changed shape)."""
    original = Strip.__dict__.get("render")
    if original is None or getattr(original, "localfab_fix", False):
        return False
    if list(inspect.signature(original).parameters) != ["self", "console"]:
        return False
    Strip.render = _render_without_controls(original)  # type: ignore[method-assign]
    return True


def apply() -> None:
    fix_styles_cache()
    fix_relayout_after_layout()
    fix_controls_in_strips()
