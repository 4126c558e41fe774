"""`localfab chat --serve [HOST:]PORT`: one loaded model for the chat app and for clients of
llama-server's API (an editor plugin, a script) at the same time.

The model is loaded once, by a `localfab serve` server that runs inside the app's process (the
server's own options, as `serve` takes them); the app chats with it as with any remote server,
taking one of its slots (`-np`). Quitting the app stops the server and frees the model.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localfab.commands.spec_flags import SPEC_FLAGS
from localfab.errors import LoadCancelled, LocalfabError, ModelError, UsageError

if TYPE_CHECKING:
    from localfab.tui.local_backend import ChatModel, Loader

DEFAULT_PORT = 8080


def serve_address(text: str) -> tuple[str, int]:
    """`[HOST:]PORT` as (host, port); the host is 127.0.0.1 when only a port is given."""
    host, _, port = text.strip().rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--serve {text!r}: give a port, or HOST:PORT (127.0.0.1:8080)")
    return host, int(port)


def closing_all(model: ChatModel, *after: Callable[[], None]) -> ChatModel:
    """`model` whose close also calls each of `after`, in order."""
    close_client = model.close

    def close() -> None:
        close_client()
        for step in after:
            step()

    model.close = close
    return model


def wait_loaded(worker: Any, cancel: threading.Event, path: Path) -> None:
    """Until the server's worker has loaded its model; its load error, or LoadCancelled."""
    while not worker.ready.wait(0.1):
        if cancel.is_set():
            raise LoadCancelled()
    error = worker.load_error
    if isinstance(error, LocalfabError):
        raise error
    if error is not None:
        raise ModelError(f"{path}: could not load the model: {error}")


def serve_options(
    name: str, host: str, port: int, parallel: int, ctx_size: int | None, template: Path | None
) -> dict[str, Any]:
    """`localfab serve`'s options: its defaults but the address, the slots, the context and
    the template file the chat command was given."""
    from localfab.commands.serve import serve

    args = [name, "--host", host, "--port", str(port), "-np", str(parallel)]
    args += ["-c", str(ctx_size)] if ctx_size is not None else []
    args += ["--chat-template-file", str(template)] if template is not None else []
    with serve.make_context("serve", args) as ctx:
        params = dict(ctx.params)
    # The speculative flags arrive gathered in the command itself; here they are defaults.
    params["spec_flags"] = {key: params.pop(key) for key in SPEC_FLAGS if key in params}
    return params


def serving_loader(
    name: str,
    address: tuple[str, int],
    parallel: int,
    loader: Any,
    *,
    ctx_size: int | None = None,
    template: Path | None = None,
) -> Loader:
    """Start the server on `name` at host:port, wait for its model, then connect the app to it
    (`loader`: what connects, `remote_loader`); the chat's close stops the server."""

    def load(progress: Any, cancel: threading.Event) -> ChatModel:
        from localfab.commands.running import RunningServer, forget_server, record_server
        from localfab.commands.serve import plan_serving, server_app
        from localfab.commands.serve_flags import is_loopback, local_url
        from localfab.config import default_paths
        from localfab.remote.client import Remote
        from localfab.server.runner import BackgroundServer
        from localfab.tui.backend import LoadProgress

        host, port = address
        options = serve_options(name, host, port, parallel, ctx_size, template)
        progress(LoadProgress("planning the model for the app and the server", 0.02, name))
        choice, config = plan_serving(name, options)
        app, settings, max_connections = server_app(name, choice, options, config)
        server = BackgroundServer(
            app,
            host=host,
            port=port,
            header_timeout=settings.header_timeout,
            max_connections=max_connections,
        ).start()
        worker = app.state.worker
        where = f"{host}:{port}"
        progress(LoadProgress("loading the model (served on " + where + ")", 0.1, name))
        try:
            wait_loaded(worker, cancel, choice.path)
            url = local_url(host, port)
            label = f"serving {where}" if is_loopback(host) else f"serving {where} (open)"
            keyed = settings.api_keys and os.environ.get("LLAMA_API_KEY") in settings.api_keys
            remote = Remote(url, name=label, api_key_env="LLAMA_API_KEY" if keyed else "")
            model: ChatModel = loader(remote)(progress, cancel)
        except BaseException:
            worker.cancel_all()
            server.stop()
            raise
        # Another `localfab chat` on this model is offered to attach to this server.
        running = RunningServer(os.getpid(), url, str(choice.path), name, bool(settings.api_keys))
        record = record_server(default_paths(), running)
        return closing_all(model, lambda: forget_server(record), worker.cancel_all, server.stop)

    return load
