"""`localfab run --remote URL|NAME`: the same one-shot answer from a model a server serves."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import click

from localfab.commands.run_cache import ready
from localfab.commands.spec_flags import speculation
from localfab.errors import UsageError

if TYPE_CHECKING:
    from localfab.chat.prompt import PromptBuilder
    from localfab.config import Config, Paths
    from localfab.engine.types import SpecSettings
    from localfab.runtime import ModelChoice

F = TypeVar("F", bound=Callable[..., Any])

# The model names that mean "whatever the server serves" (llama-server serves one).
SERVERS_OWN = ("-", "default")
REMOTE_FLAGS = ("remote", "api_key_env")


def remote_options(f: F) -> F:
    """Add --remote and --api-key-env."""
    f = click.option(
        "--api-key-env",
        metavar="NAME",
        help="With --remote: the environment variable that holds the server's API key.",
    )(f)
    return click.option(
        "--remote",
        metavar="URL|NAME",
        help="Answer with a model a llama-server or `localfab serve` serves (a URL, or a "
        "[remotes.NAME] of config.toml); MODEL is its model name (- for the server's own).",
    )(f)


@dataclass
class RemoteLoaded:
    """What `run` needs of a loaded model, from a remote server."""

    engine: Any  # remote.engine.RemoteEngine or remote.chat_api.ChatApiEngine
    prompts: PromptBuilder
    notices: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.engine.close()


def open_remote(
    model: str,
    config: Config,
    remote_flags: Mapping[str, Any],
    refused: Mapping[str, Any],
) -> RemoteLoaded:
    """Connect to the server --remote names; `refused`: options that only apply to a model
    loaded here (given ones are an error that says so)."""
    from localfab.chat.prompt import PromptBuilder
    from localfab.remote.engine import connect
    from localfab.remote.named import resolve_remote

    given = [name for name, value in refused.items() if value not in (None, False, ())]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise UsageError(f"{flags}: these set how a model loads here; a remote server has its own")
    remote = resolve_remote(
        remote_flags["remote"],
        config,
        model=None if model in SERVERS_OWN else model,
        api_key_env=remote_flags["api_key_env"],
    )
    engine = connect(remote)  # a llama-server, else an OpenAI chat API
    try:
        prompts = PromptBuilder(engine)
    except BaseException:
        engine.close()
        raise
    notes = [n for n in (prompts.notice, getattr(engine, "window_note", "")) if n]
    return RemoteLoaded(engine, prompts, notes)


def open_for_run(
    model: str,
    paths: Paths,
    config: Config,
    verbose: int,
    prompt_cache: bool | None,
    think_flags: dict[str, Any],
    load_flags: dict[str, Any],
    spec_flags: dict[str, Any],
    vision: dict[str, Any] | None = None,
) -> tuple[Any, ModelChoice | None, SpecSettings | None]:
    """`run`'s model, ready (see `ready`): loaded here as planned (and its choice, its
    speculative decoding), or the server --remote names (no choice: nothing was planned).
    `load_flags` holds --remote and --api-key-env too; `vision` --image and --mmproj (the
    projector is planned with the model: `plan_run_vision`)."""
    load_flags = dict(load_flags)
    remote_flags = {name: load_flags.pop(name) for name in REMOTE_FLAGS}
    if check_remote_flags(remote_flags):
        refused = {**load_flags, **spec_flags, "prompt_cache": prompt_cache}
        remote = open_remote(model, config, remote_flags, refused)
        ready(remote, paths, config, False, think_flags)
        return remote, None, None
    speculative = speculation(config, paths, spec_flags)
    choice = plan_model(model, paths, config, verbose, load_flags, vision)
    loaded = choice.open(speculative=speculative)
    use_cache = config.prompt_cache if prompt_cache is None else prompt_cache
    ready(loaded, paths, config, use_cache, think_flags)
    return loaded, choice, speculative


def plan_model(
    model: str,
    paths: Paths,
    config: Config,
    verbose: int,
    load_flags: dict[str, Any],
    vision: dict[str, Any] | None = None,
) -> ModelChoice:
    """The model and its plan: the planner picks the context, GPU layers, KV types and
    threads for this machine, explicit options override it, and the vision projector of
    `vision` (--image, --mmproj) is planned with it; -v shows the plan first, even one that
    does not fit (which then stops here)."""
    from localfab.runtime import choose_model, wishes_from_options

    wishes = wishes_from_options(config, **load_flags)
    choice = choose_model(model, paths, wishes, require_fit=False)
    if vision is not None and choice.plan.fits:
        from localfab.commands.serve_vision import plan_run_vision

        choice = plan_run_vision(choice, vision)
    if verbose:
        from localfab.commands.planning import render_plan

        click.echo(render_plan(choice.plan, choice.machine), err=True)
        if (placed := (vision or {}).get("planned")) is not None:
            click.echo(f"{placed.describe()}\n{placed.image_cost()}", err=True)
    choice.plan.require_fit()
    return choice


def remote_model_hint(model: str, words: tuple[str, ...], remote: str | None) -> str:
    """With --remote, MODEL comes first (the server's model name, - for its own) and the
    prompt after it: a question given alone is taken for the model. A name with spaces is
    refused here (no server names a model so); `localfab run --remote URL "question"`, whose
    prompt is then empty, gets the returned line as its error."""
    if remote is None or model in SERVERS_OWN:
        return ""
    import shlex

    asked = shlex.join(["localfab", "run", "--remote", remote, "-", model, *words])
    taken = (
        f"{model!r} was taken for the model's name: with --remote the first argument is the "
        f"model (- for the server's own) and the prompt follows it: {asked}"
    )
    if any(c.isspace() for c in model):
        raise UsageError(taken)
    return f"no prompt: {taken}"


def check_remote_flags(remote_flags: Mapping[str, Any]) -> bool:
    """Whether --remote was given (--api-key-env alone is an error)."""
    if remote_flags["remote"] is None:
        if remote_flags["api_key_env"] is not None:
            raise UsageError("--api-key-env goes with --remote URL")
        return False
    return True
