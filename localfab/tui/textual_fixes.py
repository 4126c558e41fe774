"""Workarounds for known Textual bugs, in one place; `tests/test_tui_textual_fixes.py` fails
loudly when the library changes under them.

- `StylesCache.get_inner_outer` (textual 8.x) is an `lru_cache` on an instance method, so its 1,024
  cache entries hold 1,024 widgets' style caches alive, with every rendered line in them
  (Textualize/textual#6665, open). In a chat whose messages are mounted and removed, that kept
  tens of thousands of dead objects reachable, and every garbage-collector pass walked them. The
  method never uses its instance; here the cache is keyed by its two colours only.
"""

from __future__ import annotations

import functools
from typing import Any

from textual._styles_cache import StylesCache


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


def apply() -> None:
    fix_styles_cache()
