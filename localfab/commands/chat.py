"""`localfab chat`: the terminal app (also what `localfab` alone opens on a terminal)."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localfab.commands.thinking import template_file_option
from localfab.errors import UsageError

if TYPE_CHECKING:
    from localfab.chat.history import History
    from localfab.config import Config, Paths
    from localfab.gguf.facts import ModelFacts
    from localfab.plan import Wishes
    from localfab.remote.client import Remote
    from localfab.tui.app import LocalfabApp
    from localfab.tui.local_backend import ChatOptions, LocalBackend


def last_used_model() -> str | None:
    """The model used most recently, for `localfab` with no arguments; on a first start (no
    model used yet) the built-in first-run model, when its package is installed."""
    from localfab.config import default_paths
    from localfab.store import Store
    from localfab.store.embedded import FIRST_RUN

    try:
        entries = [e for e in Store(default_paths()).list() if e.last_used and e.present]
    except Exception:  # a damaged registry must not keep the app from opening
        return None
    if not entries:
        return FIRST_RUN.name if FIRST_RUN.available() else None
    return max(entries, key=lambda e: e.last_used or 0.0).name


def open_history(path: Path) -> tuple[History, str | None]:
    """The chat history, or an in-memory one with the reason when the file cannot be used.

    A locked or damaged database is left as it is (nothing in it is lost or overwritten); the
    app then runs with chats that are not saved, and says so.
    """
    from localfab.chat.history import History

    try:
        return History(path), None
    except sqlite3.Error as exc:
        reason = (
            f"the chat history {path} cannot be opened ({exc}); this session's chats will not be "
            "saved. If another localfab is running, close it; if the file is damaged, move it "
            "aside to start a new one."
        )
        return History(Path(":memory:")), reason


def load_config(paths: Paths) -> tuple[Config, str | None]:
    """The settings, or the defaults with the reason when config.toml (or LOCALFAB_*) is bad.

    The app must open even then, so the user can fix the setting from its settings screen.
    """
    from localfab.config import Config

    try:
        return Config.load(paths), None
    except UsageError as exc:
        return Config(), f"{exc}. The app is using the default settings until this is fixed."


def saved_chat_model(history: History, session_id: int | None, model: str | None) -> str | None:
    """The model to open: the one asked for, else that of saved chat `session_id`."""
    if session_id is None:
        return model
    stored = history.session(session_id)
    if stored is None:
        raise UsageError(f"no saved chat {session_id}: the app's Chats panel lists them")
    return model or stored.model or None


@contextlib.contextmanager
def terminal_asked(previews: str) -> Iterator[None]:
    """Ask the terminal what pictures it draws (a few escape sequences and their answers, up
    to a few hundred ms) while the body builds the app; done when the body ends, also on an
    error, since the app then reads every answer itself and the terminal must be left as it
    was."""
    from localfab.tui.previews import detect

    asking = threading.Thread(target=detect, args=(previews,), name="previews", daemon=True)
    asking.start()
    try:
        yield
    finally:
        asking.join()


def run_app(app: LocalfabApp, history: History) -> None:
    """Run the app until the user quits; close the model it ended on and the history."""
    try:
        app.run()
    finally:
        if app.backend is not None:  # the model the user ended on
            app.backend.close()
        history.close()
    exit_with(app.return_code)


def open_app(
    model: str | None,
    *,
    session_id: int | None = None,
    new: bool = False,
    system: str | None = None,
    theme: str | None = None,
    **backend: Any,
) -> None:
    """Build the app for MODEL (or a saved session) and run it until the user quits;
    `backend`: how its models are opened (`backend_factory`'s options)."""
    from localfab.config import default_paths
    from localfab.store import Store
    from localfab.tui.app import AppDeps, make_app
    from localfab.tui.models import LocalModels

    paths = default_paths()
    config, config_problem = load_config(paths)
    with terminal_asked(config.image_previews):  # beside the app's start
        history, problem = open_history(paths.sessions_db)
        model = saved_chat_model(history, session_id, model)
        session_id = None if new else session_id

        backend_for = backend_factory(
            paths,
            history,
            lambda: app.config if app is not None else config,
            **backend,
        )

        def facts_for(name: str) -> ModelFacts:
            from localfab.gguf.facts import read_facts  # loaded when the fit screen opens

            return read_facts(Store(paths).resolve(name))

        app: LocalfabApp | None = None
        remote: Remote | None = backend.get("remote")
        start = remote_label(remote) if remote is not None else model
        first = backend_for(start) if start else None
        app = make_app(
            AppDeps(
                models=LocalModels(paths, known_remotes(config, backend.get("remote"))),
                backend_factory=backend_for,
                facts_for=facts_for,
                config=config,
                paths=paths,
                notices=tuple(p for p in (config_problem, problem) if p),
                backend=first,
                history=history,
                model_name=start,
                session_id=session_id,
                system=system,
                theme=theme or config.theme or None,
                themes_dir=paths.themes_dir,
                keymap=config.keys,
            )
        )
    run_app(app, history)


def backend_factory(
    paths: Paths,
    history: History,
    current: Callable[[], Config],
    *,
    ctx_size: int | None = None,
    template_file: Path | None = None,
    remote: Remote | None = None,
    serving: tuple[tuple[str, int], int] | None = None,
    mmproj: Path | None = None,
) -> Callable[..., LocalBackend]:
    """What makes the app's backend for a model name (and the fit screen's wishes), with the
    settings as they are then (`current`: the settings screen may have saved new ones).
    `template_file`: a chat template used instead of each model's own; `remote`: chat with the
    model a server serves instead of loading one here; `serving`: the address and slots of a
    server in this process that holds the app's model."""
    from localfab.tui.local_backend import LocalBackend
    from localfab.tui.model_loader import model_loader

    def backend_for(name: str, wishes: Wishes | None = None) -> LocalBackend:
        now = current()
        tools = tool_servers(now, paths)  # the config's MCP servers
        # `model@server`: --remote's, a saved chat's or a choice on the models screen.
        on_server = remote_named(name, known_remotes(now, remote))
        if on_server is not None:
            from localfab.tui.remote_backend import remote_loader

            on = remote_loader(on_server)
            return LocalBackend(on, history, name, chat_options(now), **tools)
        if serving is not None:  # the model is loaded by a server in this process
            from localfab.commands.chat_serve import serving_loader
            from localfab.tui.remote_backend import remote_loader

            on = serving_loader(
                name, *serving, remote_loader, ctx_size=ctx_size, template=template_file
            )
            return LocalBackend(on, history, name, chat_options(now), **tools)
        loader = model_loader(
            name,
            paths,
            now,
            ctx_size=ctx_size,
            wishes=wishes,
            template_file=template_file,
            mmproj=mmproj,
        )
        ledger = paths.data_dir / "ledger.sqlite3" if now.ledger else None  # figures, if on
        return LocalBackend(loader, history, name, chat_options(now), ledger_file=ledger, **tools)

    return backend_for


def known_remotes(config: Config, remote: Remote | None) -> dict[str, Remote]:
    """The remote servers the models screen lists, by label: config.toml's [remotes.NAME]
    (none when one is wrong: the app still opens) and the app's --remote."""
    from localfab.remote.named import named_remotes

    try:
        remotes = named_remotes(config)
    except UsageError as exc:
        logging.getLogger("localfab.tui").warning("remote servers left out: %s", exc)
        remotes = {}
    if remote is not None:
        remotes[remote.label] = remote
    return remotes


def remote_named(name: str, remotes: dict[str, Remote]) -> Remote | None:
    """The remote `model@server` names (`@server`: the server's own model), where the server
    is a known remote or a URL; None for a local model's name."""
    import dataclasses

    from localfab.remote.client import Remote

    model, at, label = name.rpartition("@")
    if not at:
        return None
    if label in remotes:
        return dataclasses.replace(remotes[label], model=model or remotes[label].model)
    if label.startswith(("http://", "https://")):
        return Remote(label, model=model)
    return None


def remote_label(remote: Remote) -> str:
    """How a chat on a remote is named, stored and reopened: `model@server` (`@server`: the
    server's own model)."""
    return f"{remote.model}@{remote.label}"


def chat_options(config: Config) -> ChatOptions:
    """The chat's generation settings from the configuration (read again when it changes)."""
    from localfab.engine import SamplingParams
    from localfab.tui.local_backend import ChatOptions

    return ChatOptions(
        max_tokens=config.max_tokens,
        max_continues=config.max_continues,
        sampling=SamplingParams(
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            min_p=config.min_p,
            repeat_penalty=config.repeat_penalty,
        ),
        thinking=config.thinking,
        reasoning_budget=config.reasoning_budget,
    )


def exit_with(return_code: int | None) -> None:
    """End the process with the app's return code when it is not 0: an app that crashed
    (Textual printed the traceback and set 1) must not look like a clean quit to a shell."""
    if return_code:
        raise SystemExit(return_code)


@click.command()
@click.argument("model", required=False)
@click.option("--session", "session_id", type=int, help="Resume this saved chat.")
@click.option("--new", is_flag=True, help="Start a new chat (the default unless --session).")
@click.option("--system", "-s", help="System prompt for a new chat.")
@click.option("-c", "--ctx-size", type=int, default=None, help="Context window in tokens.")
@click.option("--theme", help="Theme name (localfab-dark, localfab-light, ...).")
@template_file_option(exists=True)
@click.option(
    "--remote",
    metavar="URL|NAME",
    help="Chat with a model served elsewhere: a llama-server or `localfab serve` URL, or a "
    "[remotes.NAME] of config.toml; MODEL is then the server's model name.",
)
@click.option(
    "--api-key-env",
    metavar="NAME",
    help="With --remote: the environment variable that holds the server's API key.",
)
@click.option(
    "--serve",
    "serve_at",
    metavar="[HOST:]PORT",
    help="Also serve the model with llama-server's API at this address (one load for the app "
    "and its clients: an editor plugin shares the model); the app's chat takes a slot.",
)
@click.option(
    "--attach/--no-attach",
    default=None,
    help="When a localfab serve on this machine already holds MODEL: chat through it "
    "(--attach) or load the model again here (--no-attach); asked when not given.",
)
@click.option(
    "-mm",
    "--mmproj",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="The model's vision projector (mmproj GGUF): messages may then carry images "
    "(/image PATH, or paste or drop a path). Found by itself beside the model file.",
)
@click.option(
    "-np",
    "--parallel",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="With --serve: the server's slots (requests generated at once), the app's included.",
)
def chat(
    model: str | None,
    session_id: int | None,
    new: bool,
    system: str | None,
    ctx_size: int | None,
    theme: str | None,
    chat_template_file: Path | None,
    remote: str | None,
    api_key_env: str | None,
    serve_at: str | None,
    attach: bool | None,
    parallel: int,
    mmproj: Path | None,
) -> None:
    """Chat with MODEL in the terminal app (a registered name, a .gguf path or smollm2:135m).

    With --session ID the saved chat is resumed on its own model unless MODEL is given.
    """
    where = remote_from_options(remote, model, api_key_env, ctx_size, chat_template_file)
    serving = serving_from_options(serve_at, parallel, where)
    if where is None and serving is None:
        where = attached(model, attach)
    if session_id is not None and new:
        raise UsageError("--session and --new cannot be used together")
    if mmproj is not None and (where is not None or serving is not None):
        raise UsageError("--mmproj is for a model the app loads itself, not one a server holds")
    if ctx_size is not None and ctx_size < 16:
        raise UsageError(f"--ctx-size {ctx_size} is too small; use at least 16")
    open_app(
        model,
        session_id=session_id,
        new=new,
        system=system,
        ctx_size=ctx_size,
        theme=theme,
        template_file=chat_template_file,
        remote=where,
        serving=serving,
        mmproj=mmproj,
    )


def attached(model: str | None, attach: bool | None) -> Remote | None:
    """The `localfab serve` already holding `model` that the app chats through, if the person
    wants it (see `running.offer_attach`)."""
    from localfab.commands.running import offer_attach
    from localfab.config import default_paths

    return offer_attach(model, default_paths(), attach)


def serving_from_options(
    serve_at: str | None, parallel: int, remote: Remote | None
) -> tuple[tuple[str, int], int] | None:
    """The address and slots of --serve (None: not asked)."""
    if serve_at is None:
        if parallel != 1:
            raise UsageError("-np goes with --serve [HOST:]PORT")
        return None
    if remote is not None:
        raise UsageError("--serve shares a model loaded here; with --remote none is")
    from localfab.commands.chat_serve import serve_address
    from localfab.commands.serve_flags import is_loopback

    host, port = serve_address(serve_at)
    if not is_loopback(host) and not os.environ.get("LLAMA_API_KEY"):
        raise UsageError(
            f"--serve {host}:{port} would let anyone who can reach this machine use the model: "
            "set LLAMA_API_KEY (the server then asks every client for it), or serve on "
            "127.0.0.1"
        )
    return (host, port), parallel


def remote_from_options(
    spec: str | None,
    model: str | None,
    api_key_env: str | None,
    ctx_size: int | None,
    template_file: Path | None,
) -> Remote | None:
    """The remote --remote names (None: none), checked against the options that only apply to
    a model loaded here."""
    if spec is None:
        if api_key_env is not None:
            raise UsageError("--api-key-env goes with --remote URL")
        return None
    if ctx_size is not None:
        raise UsageError("-c/--ctx-size sets a local model's window; a remote server has its own")
    if template_file is not None:
        raise UsageError("--chat-template-file applies to a local model; a remote uses its own")
    from localfab.config import Config, default_paths
    from localfab.remote.named import resolve_remote

    config = Config.load(default_paths())
    return resolve_remote(spec, config, model=model, api_key_env=api_key_env)


def tool_servers(config: Config, paths: Paths) -> dict[str, Any]:
    """The MCP servers config.toml names, the approvals file and the rounds a message may
    lead to, as `LocalBackend` takes them (no servers: none).
    A mistake in their settings is logged and leaves the chat without tools, not without a
    model."""
    from localfab.mcp.approvals import FILE_NAME, Approvals
    from localfab.mcp.config import configured_servers
    from localfab.mcp.servers import ToolServers

    try:
        servers = configured_servers(config, paths)
    except UsageError as exc:
        logging.getLogger("localfab.tui").warning("MCP servers left out: %s", exc)
        return {"tools_problem": str(exc)}
    if not servers:
        return {}
    # stdio servers' stderr goes to a file: written on the screen, it would garble it.
    log_file = paths.cache_dir / "mcp-servers.log"
    return {
        "servers": ToolServers(servers, log_file=log_file),
        "approvals": Approvals(paths.config_dir / FILE_NAME),
        "max_tool_rounds": config.tool_rounds,
    }
