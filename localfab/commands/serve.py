"""`localfab serve`: a llama-server compatible HTTP server for one model.

Flag names are llama-server's where one applies. Only click is imported here; the planner, the
engine and the web stack load inside the command so `localfab --help` stays instant.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from pathlib import Path
from typing import Any

import click

from localfab.errors import ModelError, UsageError

KV_CHOICES = click.Choice(["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"])
FA_CHOICES = click.Choice(["auto", "on", "off"])

log = logging.getLogger("localfab.server")


def is_loopback(host: str) -> bool:
    """Whether binding `host` only accepts connections from this machine."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(host, None)
            )
        except (OSError, ValueError):
            return False


@click.command("serve", context_settings={"show_default": True})
@click.argument("model_arg", metavar="[MODEL]", required=False)
@click.option("-m", "--model", "model_opt", help="Model: a .gguf path or a registered name.")
@click.option("--host", default="127.0.0.1", help="Address to listen on.")
@click.option("--port", default=8080, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("-c", "--ctx-size", type=int, default=None, help="Context window (default: plan).")
@click.option("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=None)
@click.option("-fa", "--flash-attn", type=FA_CHOICES, default=None)
@click.option("-ctk", "--cache-type-k", type=KV_CHOICES, default=None)
@click.option("-ctv", "--cache-type-v", type=KV_CHOICES, default=None)
@click.option("-t", "--threads", type=int, default=None, help="CPU threads (default: cores).")
@click.option("-b", "--batch-size", type=int, default=None)
@click.option("-ub", "--ubatch-size", type=int, default=None)
@click.option("--api-key", "api_keys", multiple=True, help="Require this key (repeatable).")
@click.option("--alias", default=None, help="Model name shown to clients.")
@click.option("--metrics", is_flag=True, help="Enable the Prometheus /metrics endpoint.")
@click.option("--slots/--no-slots", default=True, help="Enable /slots.")
@click.option("--context-shift/--no-context-shift", default=False)
@click.option("-n", "--n-predict", "--predict", type=int, default=-1, help="Max tokens per reply.")
@click.option("--seed", type=int, default=-1, help="Default sampling seed (-1: random).")
@click.option("--temp", type=float, default=0.8, help="Default sampling temperature.")
@click.option("-np", "--parallel", type=int, default=1, help="Slots (extra requests queue).")
@click.option("-to", "--timeout", type=float, default=600.0, help="Request read timeout, s.")
@click.option("--verbose", "-v", is_flag=True, help="Log llama.cpp and request details.")
def serve(model_arg: str | None, model_opt: str | None, **options: Any) -> None:
    """Serve MODEL over HTTP with llama-server's API (OpenAI-compatible and native endpoints).

    Ctrl-C or SIGTERM stops it cleanly: running generations are cancelled, the model freed.
    """
    from localfab.commands.run import setup_logging

    setup_logging(options["verbose"])
    name = model_opt or model_arg
    if not name:
        raise UsageError("no model: give it as an argument or with -m")
    if model_opt and model_arg and model_opt != model_arg:
        raise UsageError("give the model once, either as MODEL or with -m")
    if options["ctx_size"] is not None and options["ctx_size"] < 0:
        raise UsageError(f"-c {options['ctx_size']} is not a context size")
    if options["parallel"] < 1:
        options["parallel"] = 1
    for key in options["api_keys"]:
        if not key:
            raise UsageError("--api-key must not be empty")

    from localfab.config import default_paths
    from localfab.runtime import resolve_model

    path = resolve_model(name, default_paths())
    if not path.is_file():
        raise ModelError(f"{path}: no such file; check the path or run `localfab list`")
    host = options["host"]
    if not options["api_keys"] and not is_loopback(host):
        click.echo(
            f"localfab: warning: listening on {host} without an API key: anyone who can reach "
            "this machine can use the model; add --api-key KEY",
            err=True,
        )
    settings_engine = _engine_settings(path, options)
    _serve(name, path, settings_engine, options)


def _engine_settings(path: Path, options: dict[str, Any]) -> Any:
    """EngineSettings from the planner, with the user's flags as wishes."""
    from localfab.config import Config, default_paths
    from localfab.engine import EngineSettings
    from localfab.runtime import plan_for, wishes_from_options

    wishes = wishes_from_options(
        Config.load(default_paths()),
        **{
            key: options[key]
            for key in (
                "ctx_size",
                "n_gpu_layers",
                "cache_type_k",
                "cache_type_v",
                "flash_attn",
                "batch_size",
                "ubatch_size",
                "threads",
            )
        },
    )
    result, _ = plan_for(path, wishes)
    for warning in result.warnings:
        click.echo(f"localfab: warning: {warning}", err=True)
    result.require_fit()
    return EngineSettings(**result.settings_kwargs())


def _serve(name: str, path: Path, engine_settings: Any, options: dict[str, Any]) -> None:
    from localfab.runtime import load_model
    from localfab.server import ServerSettings, create_app
    from localfab.server.runner import make_foreground_server

    settings = ServerSettings(
        model_name=name,
        alias=options["alias"],
        api_keys=tuple(options["api_keys"]),
        metrics=options["metrics"],
        slots=options["slots"],
        n_parallel=options["parallel"],
        n_predict=options["n_predict"],
        temperature=options["temp"],
        seed=options["seed"],
        context_shift=options["context_shift"],
        read_timeout=options["timeout"],
    )

    def loader() -> Any:
        loaded = load_model(path, engine_settings)
        for notice in loaded.notices:
            click.echo(f"localfab: note: {notice}", err=True)
        click.echo(
            f"localfab: model loaded: {path.name}, context {loaded.engine.n_ctx} tokens",
            err=True,
        )
        return loaded

    app = create_app(loader, settings)
    server = make_foreground_server(
        app,
        host=options["host"],
        port=options["port"],
        verbose=options["verbose"],
        on_exit=app.state.worker.cancel_all,
    )
    click.echo(
        f"localfab: serving {name} on http://{options['host']}:{options['port']} "
        "(llama-server API; Ctrl-C to stop)",
        err=True,
    )
    worker = app.state.worker

    import threading

    def watch_load() -> None:
        worker.ready.wait()
        if worker.load_error is not None:
            click.echo(f"localfab: error: {worker.load_error}", err=True)
            server.should_exit = True

    threading.Thread(target=watch_load, daemon=True).start()
    server.run()
    if worker.load_error is not None:
        from localfab.errors import LocalfabError

        if isinstance(worker.load_error, LocalfabError):
            raise worker.load_error
        raise ModelError(f"{path}: could not load the model: {worker.load_error}")
    click.echo("localfab: server stopped", err=True)


COMMANDS = [serve]
