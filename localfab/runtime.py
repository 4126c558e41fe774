"""From a model name and the user's wishes to a loaded engine: the one path every front end uses."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localfab.config import Config, Paths, check_threads
from localfab.engine.types import EngineSettings

if TYPE_CHECKING:
    from localfab.chat.prompt import PromptBuilder
    from localfab.engine import Engine
    from localfab.hardware import Machine
    from localfab.plan import Plan, Wishes

log = logging.getLogger("localfab.runtime")


def resolve_model(name: str, paths: Paths) -> Path:
    """A GGUF path, the embedded test model's name, or a registered model name -> its file."""
    from localfab.store import Store

    store = Store(paths)
    path = store.resolve(name)
    store.touch(name)  # "last used" in `localfab list`; best effort, a no-op for plain paths
    return path


@dataclass
class LoadedModel:
    """An engine ready to use, with its prompt builder and what the user should be told."""

    engine: Engine
    prompts: PromptBuilder
    path: Path
    notices: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.engine.close()


def wishes_from_options(
    config: Config,
    *,
    ctx_size: int | None = None,
    min_ctx: int | None = None,
    n_gpu_layers: int | None = None,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    flash_attn: str | None = None,
    batch_size: int | None = None,
    ubatch_size: int | None = None,
    threads: int | None = None,
) -> Wishes:
    """The planner's wishes from command-line options, with config.toml / LOCALFAB_* as defaults.

    An explicit -c below the configured floor lowers the floor: what the user asks for wins.
    Thread counts go through `check_threads` (-1 and 0 mean one per physical core; other values
    below 1 are a `UsageError`), the one check that `run`, `serve` and `plan` all pass.
    """
    from localfab.plan import Wishes

    if threads:  # an explicit -t wins over the config, -1 (auto) included
        chosen_threads = check_threads(threads, source="-t/--threads")
    else:
        chosen_threads = check_threads(config.threads, source="config threads")

    floor = config.min_ctx if min_ctx is None else min_ctx
    if ctx_size:
        floor = min(floor, ctx_size)
    return Wishes(
        n_ctx=ctx_size or config.ctx_size or None,
        min_ctx=floor,
        n_gpu_layers=n_gpu_layers,
        type_k=cache_type_k,
        type_v=cache_type_v,
        flash_attn=flash_attn or config.flash_attn,
        n_batch=batch_size,
        n_ubatch=ubatch_size,
        threads=chosen_threads or None,
    )


def engine_backend_info() -> Mapping[str, Any]:
    """The engine's `backend_info()`, imported only when called (it loads llama_cpp).

    Hardware probing sits below the engine, so the front ends hand it this callable.
    """
    from localfab.engine import backend_info

    return backend_info()


def probe_this_machine() -> Machine:
    """This machine, with the backends the installed llama-cpp-python was built for."""
    from localfab.hardware import probe_machine

    return probe_machine(backend_info=engine_backend_info)


def plan_for(path: Path, wishes: Wishes) -> tuple[Plan, Machine]:
    """Plan the load of `path` on this machine."""
    from localfab.facts import read_facts
    from localfab.plan import plan

    machine = probe_this_machine()
    return plan(read_facts(path), machine, wishes), machine


@dataclass(frozen=True)
class ModelChoice:
    """A model found and planned for this machine: what `open()` loads, and why.

    `run`, `serve`, `bench` and the chat app all get here through `choose_model`, so they load
    the same file with the same plan for the same wishes.
    """

    name: str
    path: Path
    plan: Plan
    machine: Machine

    @property
    def settings(self) -> EngineSettings:
        return EngineSettings(**self.plan.settings_kwargs())

    def open(self, *, progress: Callable[[float], bool] | None = None) -> LoadedModel:
        """Load the planned model (`progress` as in `load_model`)."""
        return load_model(self.path, self.settings, progress=progress)


def choose_model(
    name: str, paths: Paths, wishes: Wishes, *, require_fit: bool = True
) -> ModelChoice:
    """Find `name` (a path, the embedded model or a registered name) and plan it for this machine.

    With `require_fit`, a plan that does not fit raises (`Plan.require_fit`); without, the caller
    may show the plan first and call `choice.plan.require_fit()` itself.
    """
    path = resolve_model(name, paths)
    chosen, machine = plan_for(path, wishes)
    if require_fit:
        chosen.require_fit()
    return ModelChoice(name=name, path=path, plan=chosen, machine=machine)


def load_model(
    path: Path,
    settings: EngineSettings,
    *,
    progress: Callable[[float], bool] | None = None,
) -> LoadedModel:
    """Load the engine and resolve its chat template.

    `progress` gets the fraction of the weights loaded; returning False cancels the load
    (`LoadCancelled`).
    """
    from localfab.chat.prompt import PromptBuilder
    from localfab.engine import Engine

    engine = Engine(path, settings, progress=progress)
    prompts = PromptBuilder(engine)
    notices = [prompts.notice] if prompts.notice else []
    if engine.n_ctx != settings.n_ctx:
        notices.append(
            f"context {settings.n_ctx} became {engine.n_ctx} tokens "
            "(llama.cpp allocates the KV cache in steps of 256)"
        )
    if settings.n_ctx > engine.n_ctx_train > 0:
        notices.append(
            f"context {settings.n_ctx} is larger than the {engine.n_ctx_train} tokens the model "
            "was trained on; answers may degrade past that"
        )
    return LoadedModel(engine=engine, prompts=prompts, path=path, notices=notices)
