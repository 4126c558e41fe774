"""`localfab serve`: a llama-server compatible HTTP server for one model.

Flag names are llama-server's where one applies. Only click is imported here; the planner, the
engine and the web stack load inside the command so `localfab --help` stays instant.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localfab.commands.running import RunningServer, forget_server, record_server
from localfab.commands.serve_flags import (
    aip_port,
    allowed_origins,
    api_keys,
    cache_disk,
    cache_ram_limit,
    is_loopback,
    llama_server_options,
    local_url,
    refused_options,
    slot_folder,
    template_kwargs,
    tool_call_option,
)
from localfab.commands.serve_router import router_options, serve_router
from localfab.commands.serve_vision import finish_load, media_folder, plan_vision, vision_options
from localfab.commands.spec_flags import spec_options, speculation
from localfab.commands.thinking import (
    budget_options,
    chat_template_option,
    reasoning_option,
    template_file_option,
)
from localfab.engine.prompt_cache import DEFAULT_LIMIT
from localfab.errors import ModelError, UsageError
from localfab.units import KV_CACHE_TYPES, MiB

if TYPE_CHECKING:
    from collections.abc import Callable

    from localfab.config import Config
    from localfab.plan import Wishes
    from localfab.runtime import ModelChoice
    from localfab.server import ServerSettings

KV_CHOICES = click.Choice(KV_CACHE_TYPES)
FA_CHOICES = click.Choice(["auto", "on", "off"])

log = logging.getLogger("localfab.server")

# -np -1 (llama-server's "auto", the default): this many slots sharing one KV pool of the plan's
# -c (no more memory than one slot); a side request (a title) runs beside a reply, not after it.
AUTO_SLOTS = 4
# llama-server's default --cache-ram, in MiB.
DEFAULT_CACHE_RAM_MIB = DEFAULT_LIMIT // MiB


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
@click.option(
    "--api-key",
    "api_keys",
    multiple=True,
    help="Require this key (repeatable; default: $LLAMA_API_KEY). The variable and "
    "--api-key-file keep the key out of `ps`.",
)
@click.option(
    "--api-key-file",
    "api_key_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Require the keys in this file: one a line, blank lines ignored.",
)
@click.option("--alias", default=None, help="Model name shown to clients.")
@click.option("--metrics", is_flag=True, help="Enable the Prometheus /metrics endpoint.")
@click.option("--slots/--no-slots", default=True, help="Enable /slots.")
@click.option("--context-shift/--no-context-shift", default=False)
@click.option(
    "--slot-save-path",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder where POST /slots/ID?action=save writes a slot's prompt (and restore reads).",
)
@click.option(
    "-cram",
    "--cache-ram",
    type=int,
    default=None,
    help="MiB of RAM for the prompts of idle conversations, restored when they come back "
    "(-1: no limit, 0: off; default: 8192, or half the free RAM when that is less).",
)
@click.option(
    "--cache-idle-slots/--no-cache-idle-slots",
    default=True,
    help="When a request starts, keep idle slots' prompts in the prompt cache (--cache-ram) and, "
    "with --kv-unified, free their room in the pool.",
)
@click.option(
    "--cache-disk",
    type=int,
    default=0,
    show_default=True,
    help="MiB of the cache folder for the prompt cache's disk tier: states kept in RAM are also "
    "written there, found again after a restart and shared with the chat app (0: off).",
)
@click.option(
    "--reasoning-format",
    type=click.Choice(["none", "deepseek", "deepseek-legacy", "auto"]),
    default="auto",
    show_default=True,
    help="Where a thinking model's reasoning goes: reasoning_content, streamed as "
    "delta.reasoning_content (auto, deepseek, deepseek-legacy), or left in content (none).",
)
@reasoning_option
@budget_options
@click.option(
    "--reasoning-effort",
    default="default",
    show_default=True,
    help="The template's reasoning_effort variable (gpt-oss and others): minimal, low, medium, "
    "high... (default: the template's own).",
)
@click.option(
    "--reasoning-preserve/--no-reasoning-preserve",
    default=None,
    help="Keep earlier turns' reasoning in the prompt, where the template can "
    "(its preserve_reasoning; default: the template's own).",
)
@template_file_option(exists=True)
@chat_template_option
@click.option(
    "--jinja/--no-jinja",
    default=True,
    show_default=True,
    help="Requests may carry tools: the chat template renders them and the reply's calls "
    "come back as tool_calls (--no-jinja refuses them, as llama-server).",
)
@tool_call_option
@click.option(
    "--chat-template-kwargs",
    default=None,
    help="The chat template's variables as a JSON object, e.g. '{\"enable_thinking\": false}'.",
)
@click.option(
    "-n", "--n-predict", "--predict", type=int, default=-1, help="Tokens per reply that sets none."
)
@click.option("--seed", type=int, default=-1, help="Default sampling seed (-1: random).")
@click.option(
    "--temp", type=float, default=None, help="Default temperature (else config.toml's: 0.8)."
)
@click.option("--top-k", type=int, default=None, help="Default top-k (else config.toml's: 40).")
@click.option("--top-p", type=float, default=None, help="Default top-p (else config.toml's: 0.95).")
@click.option("--min-p", type=float, default=None, help="Default min-p (else config.toml's: 0.05).")
@click.option(
    "--repeat-penalty",
    type=float,
    default=None,
    help="Default repetition penalty (else config.toml's: 1.0).",
)
@click.option(
    "-np",
    "--parallel",
    type=int,
    default=-1,
    help="Slots: requests decoded together, each with -c / N of the context (more queue); "
    f"-1 (default, as llama-server): {AUTO_SLOTS} slots sharing one KV pool of -c tokens.",
)
@click.option(
    "-kvu",
    "--kv-unified",
    "kv_unified",
    is_flag=True,
    help="All slots share one KV pool of -c tokens instead of -c / N each.",
)
@click.option("-to", "--timeout", type=float, default=600.0, help="Request read timeout, s.")
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    help="Seconds a client has to send a complete request head before it is disconnected.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=256,
    help="Open connections at most (also bounded by the open-file limit). At the limit a new "
    "one replaces an idle one (no complete request head yet); if every one has a request in "
    "progress, it gets 503.",
)
@click.option(
    "--allowed-origins",
    "--cors-origins",
    "allowed_origins",
    multiple=True,
    help="Browser origins, besides localhost ones, that may use the server: comma-separated, "
    "* as wildcard (https://*.example.com), * alone for any; localhost: only those (the "
    "default). Default: LOCALFAB_ORIGINS.",
)
@llama_server_options
@router_options
@refused_options
@vision_options
@click.option(
    "--no-ledger",
    "no_ledger",
    is_flag=True,
    help="Do not record replies in the usage ledger (see localfab stats). Request text is "
    "never recorded either way.",
)
@click.option(
    "--verbose",
    "-v",
    count=True,
    help="Log requests and llama.cpp's warnings; -vv: every line of llama.cpp's log.",
)
@spec_options
def serve(model_arg: str | None, model_opt: str | None, **options: Any) -> None:
    """Serve MODEL over HTTP with llama-server's API (OpenAI-compatible and native endpoints).

    Ctrl-C or SIGTERM stops it cleanly: running generations are cancelled, the model freed.
    """
    from localfab.commands.run import setup_logging

    setup_logging(options["verbose"])
    name = model_opt or model_arg
    if not name:  # llama-server's router mode: models loaded as requests name them
        check_options(options)
        return serve_router(options, server_settings, serve_wishes)
    if model_opt and model_arg and model_opt != model_arg:
        raise UsageError("give the model once, either as MODEL or with -m")
    if options.pop("web_ui", None):
        click.echo(
            "localfab: note: there is no web UI; chat with `localfab chat` (or --serve from it)",
            err=True,
        )
    options.pop("offline", None)  # nothing is downloaded while serving, with or without it
    choice, config = plan_serving(name, options)
    _serve(name, choice, options, config)


def plan_serving(name: str, options: dict[str, Any]) -> tuple[ModelChoice, Config]:
    """Check `serve`'s options (completing some of them in place) and plan the model as they
    ask; warns on stderr of what the user should know (no key on an open address)."""
    check_options(options)

    from localfab.config import Config, default_paths
    from localfab.runtime import choose_model

    paths = default_paths()
    config = Config.load(paths)
    # Checked before the model loads: a bad --draft-max is one line, not a load.
    options["speculative"] = speculation(config, paths, options["spec_flags"])
    # The planner's choice, with the user's flags as wishes (the same path as `run`).
    choice = choose_model(name, paths, serve_wishes(options, config), require_fit=False)
    for warning in choice.plan.warnings:
        click.echo(f"localfab: warning: {warning}", err=True)
    choice.plan.require_fit()
    choice, options["mmproj_plan"] = plan_vision(choice, options)
    return choice, config


def check_options(options: dict[str, Any]) -> None:
    """The options a server and a router share, checked and completed in place (keys,
    origins, Vertex AI's port); warns when an open address has no key."""
    if options["ctx_size"] is not None and options["ctx_size"] < 0:
        raise UsageError(f"-c {options['ctx_size']} is not a context size")
    if options["parallel"] == -1:  # auto
        options["parallel"], options["kv_unified"] = AUTO_SLOTS, True
    elif options["parallel"] < 1:
        raise UsageError(
            f"-np {options['parallel']}: give a number of slots (1 or more), or -1 for "
            f"{AUTO_SLOTS} slots sharing one KV pool"
        )
    sleep = options.get("sleep_idle_seconds", -1)
    if sleep != -1 and sleep <= 0:
        raise UsageError(f"--sleep-idle-seconds {sleep:g}: give a number of seconds above 0, or -1")
    for key in options["api_keys"]:
        if not key:
            raise UsageError("--api-key must not be empty")
    options["api_keys"] = api_keys(options["api_keys"], options["api_key_file"])
    options["allowed_origins"] = allowed_origins(options["allowed_origins"])
    options["port"] = aip_port(options["port"])
    host = options["host"]
    if not options["api_keys"] and not is_loopback(host):
        click.echo(
            f"localfab: warning: listening on {host} without an API key: anyone who can reach "
            "this machine can use the model; add --api-key KEY",
            err=True,
        )


# Sampling flags and the config.toml / LOCALFAB_* setting each one defaults to.
SAMPLING_FLAGS = {
    "temp": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repeat_penalty",
}


def sampling_defaults(options: dict[str, Any], config: Config) -> dict[str, Any]:
    """The server's default sampling, as llama-server ranks it: an explicit flag, else
    config.toml / LOCALFAB_* (whose own defaults are the built-in ones)."""
    return {
        setting: getattr(config, setting) if options.get(flag) is None else options[flag]
        for flag, setting in SAMPLING_FLAGS.items()
    }


def serve_wishes(options: dict[str, Any], config: Config) -> Wishes:
    """The planner's wishes from the user's flags, config.toml as the defaults."""
    from localfab.runtime import wishes_from_options

    return wishes_from_options(
        config,
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


def _ledger(options: dict[str, Any], config: Config) -> Any:
    """The usage ledger's writer, unless --no-ledger, `ledger = false` or LOCALFAB_LEDGER=off."""
    from localfab.config import default_paths
    from localfab.ledger.writer import Ledger, LedgerWriter, ledger_enabled, ledger_path

    if options["no_ledger"] or not ledger_enabled(config):
        return None
    return LedgerWriter(Ledger(ledger_path(default_paths().data_dir)))


def server_settings(
    name: str, options: dict[str, Any], config: Config, cache_budget: int | None = None
) -> ServerSettings:
    """The server's settings from the command line and the configured sampling defaults."""
    from localfab.server import ServerSettings

    return ServerSettings(
        model_name=name,
        alias=options["alias"],
        tags=tuple(t.strip() for t in options.get("tags", "").split(",") if t.strip()),
        sleep_idle_seconds=options.get("sleep_idle_seconds", -1),
        spm_infill=options.get("spm_infill", False),
        api_keys=tuple(options["api_keys"]),
        metrics=options["metrics"],
        slots=options["slots"],
        n_parallel=options["parallel"],
        n_predict=options["n_predict"],
        seed=options["seed"],
        context_shift=options["context_shift"],
        cache_ram=cache_ram_limit(options["cache_ram"], cache_budget),
        cache_idle_slots=options["cache_idle_slots"],
        slot_save_path=slot_folder(options["slot_save_path"]),
        media_path=media_folder(options["media_path"]),
        cache_disk=cache_disk(options["cache_disk"]),
        reasoning_format=options["reasoning_format"],
        reasoning=options["reasoning"],
        reasoning_budget=options["reasoning_budget"],
        reasoning_budget_message=options["reasoning_budget_message"],
        reasoning_effort=options["reasoning_effort"],
        reasoning_preserve=options["reasoning_preserve"],
        chat_template_kwargs=template_kwargs(options["chat_template_kwargs"]),
        jinja=options["jinja"],
        tool_call_lenient=options.get("tool_call_lenient", False),
        read_timeout=options["timeout"],
        header_timeout=options["header_timeout"],
        max_connections=options["max_connections"],
        check_host=is_loopback(options["host"]),
        allowed_origins=options["allowed_origins"],
        verbose=options["verbose"],
        **sampling_defaults(options, config),
    )


def _loader(choice: ModelChoice, options: dict[str, Any], n_parallel: int) -> Callable[[], Any]:
    """Loads the model on the engine thread, once the server listens, and says so."""

    def loader() -> Any:
        loaded = choice.open(
            speculative=options["speculative"],
            parallel=n_parallel,
            kv_unified=options["kv_unified"],
        )
        finish_load(loaded, options)
        for notice in loaded.notices:
            click.echo(f"localfab: note: {notice}", err=True)
        engine = loaded.engine
        slots = f", {engine.n_seq_max} slots of {engine.n_ctx}" if engine.n_seq_max > 1 else ""
        click.echo(
            f"localfab: model loaded: {choice.path.name}, context {engine.n_ctx_total} "
            f"tokens{slots}",
            err=True,
        )
        return loaded

    return loader


def server_app(
    name: str, choice: ModelChoice, options: dict[str, Any], config: Config
) -> tuple[Any, ServerSettings, int]:
    """The server's ASGI app (its model loads on its worker once it listens), its settings
    and the most connections it takes."""
    from localfab.server import create_app
    from localfab.server.runner import connection_cap

    settings = server_settings(name, options, config, choice.plan.prompt_cache)
    loader = _loader(choice, options, settings.n_parallel)
    max_connections = connection_cap(settings.max_connections)
    if max_connections < settings.max_connections:
        click.echo(
            f"localfab: warning: taking at most {max_connections} connections, not "
            f"{settings.max_connections}: the open-file limit is low; raise it with ulimit -n",
            err=True,
        )
    return create_app(loader, settings, ledger=_ledger(options, config)), settings, max_connections


def _serve(name: str, choice: ModelChoice, options: dict[str, Any], config: Config) -> None:
    from localfab.server.runner import make_foreground_server

    path = choice.path
    app, settings, max_connections = server_app(name, choice, options, config)
    server = make_foreground_server(
        app,
        host=options["host"],
        port=options["port"],
        verbose=options["verbose"],
        on_exit=app.state.worker.cancel_all,
        header_timeout=settings.header_timeout,
        max_connections=max_connections,
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
    from localfab.config import default_paths

    # Known on this machine while it runs: `localfab chat` on the same model offers to attach.
    record = record_server(
        default_paths(),
        RunningServer(
            os.getpid(),
            local_url(options["host"], options["port"]),
            str(path),
            name,
            keyed=bool(settings.api_keys),
        ),
    )
    try:
        server.run()
    finally:
        forget_server(record)
    if worker.load_error is not None:
        from localfab.errors import LocalfabError

        if isinstance(worker.load_error, LocalfabError):
            raise worker.load_error
        raise ModelError(f"{path}: could not load the model: {worker.load_error}")
    click.echo("localfab: server stopped", err=True)
