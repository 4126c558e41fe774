"""`localfab serve` without a model: the router over the models it finds (llama-server's router
mode), each planned by the planner and loaded within the memory budget."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from localfab.errors import UsageError
from localfab.units import MiB, format_context

if TYPE_CHECKING:
    from localfab.config import Config, Paths
    from localfab.plan import Wishes
    from localfab.server import ServerSettings
    from localfab.server.router_models import RouterModel
    from localfab.server.router_pool import Cost

F = TypeVar("F", bound=Callable[..., Any])

# The router's own flags (and the server's address and key): not passed to a model's server.
ROUTER_FLAGS_WITH_VALUE = {
    "--models-dir", "--models-preset", "--models-max", "--models-memory", "--host", "--port",
    "--api-key", "--api-key-file", "--alias", "-m", "--model", "--hf-repo", "-hf", "-hfr",
}  # fmt: skip
ROUTER_SWITCHES = {"--models-autoload", "--no-models-autoload"}


def router_options(f: F) -> F:
    """llama-server's router flags, and --models-memory (the budget the planner fills)."""
    f = click.option(
        "--models-autoload/--no-models-autoload",
        default=True,
        help="Router: load a model when a request names it (default), or only by "
        "POST /models/load.",
    )(f)
    f = click.option(
        "--models-memory",
        type=click.IntRange(min=1),
        default=None,
        help="Router: MiB of RAM the loaded models may take together, by their plans (default: "
        "the memory free at the first request; a GPU's free memory bounds what goes on it).",
    )(f)
    f = click.option(
        "--models-max",
        type=click.IntRange(min=0),
        default=4,
        help="Router: models loaded at once at most (0: as many as the memory holds).",
    )(f)
    f = click.option(
        "--models-preset",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="Router: an INI file of models: [name] sections of llama-server flags "
        "(model = FILE or hf-repo = REPO[:TAG], c = 4096, ...), [*] for all of them.",
    )(f)
    f = click.option(
        "--models-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="Router: a folder of models (each .gguf, each folder holding one).",
    )(f)
    return f


def child_args(argv: list[str]) -> list[str]:
    """The router's command line less its own flags: what every model's server also gets."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in ROUTER_FLAGS_WITH_VALUE:
            skip = "=" not in arg
            continue
        if flag in ROUTER_SWITCHES:
            continue
        out.append(arg)
    if not any(a.split("=")[0] in ("-cram", "--cache-ram") for a in out):
        out += ["--cache-ram", "0"]  # idle prompts' states are not in the plans' memory
    return out


def find_models(options: dict[str, Any], paths: Paths) -> dict[str, RouterModel]:
    from localfab.server.router_models import (
        RouterModel,
        dedup,
        hub_cache,
        read_preset,
        scan_cache,
        scan_models_dir,
    )
    from localfab.store import Store

    # The store's models (the embedded ones are written out when first loaded).
    found: dict[str, RouterModel] = {
        e.name: RouterModel(e.name, e.path if e.present else None, "store")
        for e in Store(paths).list()
    }
    found.update(scan_cache(hub_cache()))
    if options["models_dir"] is not None:
        found.update(scan_models_dir(options["models_dir"]))
    if options["models_preset"] is not None:
        found.update(read_preset(options["models_preset"], hub_cache(), found))
    dedup(found, hub_cache())
    return found


def resolve(model: RouterModel) -> Path:
    from localfab.server.router_models import hub_cache, resolve_hf

    if model.path is not None:
        return model.path
    if model.source == "store":
        from localfab.config import default_paths
        from localfab.runtime import resolve_model

        return resolve_model(model.id, default_paths())
    path = resolve_hf(model.hf_repo or "", hub_cache())
    if path is None:
        raise UsageError(
            f"model {model.id}: {model.hf_repo} is not in the Hugging Face cache at "
            f"{hub_cache()}: download it first (localfab pull)"
        )
    return path


def planner(
    options: dict[str, Any], config: Config, paths: Paths, wishes_of: Callable[..., Wishes]
) -> Callable[..., Cost]:
    """What each model's plan puts on each device, with the router's flags as wishes."""
    from localfab.runtime import choose_model
    from localfab.server.router_pool import Cost

    def cost(model: RouterModel) -> Cost:
        wishes = wishes_of(options, config)
        ctx = _preset_ctx(model.args)
        if ctx is not None:
            from dataclasses import replace

            wishes = replace(wishes, n_ctx=ctx)
        plan = choose_model(str(resolve(model)), paths, wishes, require_fit=False).plan
        return Cost(
            devices={m.device: m.total for m in plan.memory if m.total},
            summary=f"{format_context(plan.n_ctx)} context, "
            + ", ".join(f"{m.total // MiB} MiB on {m.device}" for m in plan.memory if m.total),
            fits=plan.fits,
            why_not="; ".join(plan.warnings),
            available={m.device: m.available for m in plan.memory},
            flags=("-c", str(plan.n_ctx), "-ngl", str(plan.n_gpu_layers)),
        )

    return cost


def _preset_ctx(args: list[str]) -> int | None:
    for flag, value in zip(args, args[1:], strict=False):
        if flag in ("-c", "--ctx-size") and value.isdigit():
            return int(value)
    return None


def serve_router(
    options: dict[str, Any],
    settings_of: Callable[..., ServerSettings],
    wishes_of: Callable[..., Wishes],
) -> None:
    """Serve the router until Ctrl-C or SIGTERM (`settings_of` and `wishes_of`: serve's
    readings of the flags)."""
    from localfab.config import Config, default_paths
    from localfab.server.router import create_router_app
    from localfab.server.router_pool import Pool
    from localfab.server.runner import make_foreground_server

    paths = default_paths()
    config = Config.load(paths)
    models = find_models(options, paths)
    budget = {"CPU": options["models_memory"] * MiB} if options["models_memory"] else {}
    pool = Pool(
        models,
        plan=planner(options, config, paths, wishes_of),
        budget=budget,
        models_max=options["models_max"],
        child_args=child_args(sys.argv[2:]),
        resolve=resolve,
    )
    settings = settings_of("router", options, config)
    app = create_router_app(
        pool,
        settings,
        autoload=options["models_autoload"],
        rescan=lambda: find_models(options, paths),
    )
    server = make_foreground_server(
        app,
        host=options["host"],
        port=options["port"],
        verbose=options["verbose"],
        on_exit=lambda: None,
        header_timeout=settings.header_timeout,
        max_connections=settings.max_connections,
    )
    click.echo(
        f"localfab: routing {len(models)} models on http://{options['host']}:{options['port']} "
        "(each loaded when a request names it)",
        err=True,
    )
    server.run()
