"""The app's backend on a remote server: `LocalBackend` with a loader that connects instead of
loading (`remote_loader`). The chat session, its history, versions, search, export, window and
continuation are the local ones; only the engine under them speaks HTTP
(`localfab.remote.engine.RemoteEngine`)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from localfab.errors import LoadCancelled
from localfab.tui.backend import LoadProgress, ModelCard, ProgressCallback
from localfab.tui.local_backend import ChatModel, Loader

if TYPE_CHECKING:
    from localfab.remote.client import Remote


def remote_loader(remote: Remote) -> Loader:
    """Connect to `remote`, read its context, template and tokenizer, and hand the app a
    model card that names it."""

    def load(progress: ProgressCallback, cancel: threading.Event) -> ChatModel:
        from localfab.chat.prompt import PromptBuilder
        from localfab.remote.engine import connect

        progress(LoadProgress("connecting", 0.1, remote.label))
        engine = connect(remote)
        try:
            if cancel.is_set():
                raise LoadCancelled()
            return _model(remote, engine, PromptBuilder(engine), progress)
        except BaseException:
            engine.close()
            raise

    return load


def _model(remote: Remote, engine: Any, prompts: Any, progress: ProgressCallback) -> ChatModel:
    """The app's model on a connected remote, with the card the status bar shows."""
    facts = engine.facts
    name = remote.model or facts.model or remote.label
    n_ctx = engine.slot_ctx  # tokens, as the server states it (or as estimated)
    plan = (
        f"remote {remote.label}",
        f"context {n_ctx}",
        f"{getattr(facts, 'slots', 1)} slot(s)",
    )
    notices = tuple(n for n in (prompts.notice, getattr(engine, "window_note", "")) if n)
    info = ModelCard(
        name=name,
        path=remote.url,
        n_ctx=n_ctx,
        gpu_layers=0,
        total_layers=0,
        plan=plan + ((facts.build,) if getattr(facts, "build", "") else ()),
        notices=notices,
        remote=remote.label.removeprefix("http://").removeprefix("https://"),
    )
    progress(LoadProgress("ready", 1.0, f"{name} on {remote.label}"))
    return ChatModel(engine, prompts, info, engine.close, remote=remote.label)
