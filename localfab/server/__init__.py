"""The llama-server compatible HTTP front end (the only package that imports starlette/uvicorn).

`create_app(model, settings)` builds the ASGI app; `ServerSettings` holds the options. Both are
loaded on first use so importing this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localfab.server.settings import ServerSettings

if TYPE_CHECKING:
    from localfab.server.app import create_app

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from localfab.server.app import create_app

        return create_app
    raise AttributeError(name)
