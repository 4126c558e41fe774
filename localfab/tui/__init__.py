"""The terminal app (the only package that imports textual).

`make_app` builds it; `localfab.tui.backend` holds the interface it talks to a model through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localfab.tui.app import LocalfabApp, make_app

__all__ = ["LocalfabApp", "make_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from localfab.tui import app

        return getattr(app, name)
    raise AttributeError(name)
