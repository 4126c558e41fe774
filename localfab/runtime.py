"""From a model name and the user's wishes to a loaded engine: the one path every front end uses."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from localfab.config import Paths
from localfab.engine.types import EngineSettings

if TYPE_CHECKING:
    from localfab.chat.prompt import PromptBuilder
    from localfab.engine import Engine
    from localfab.hardware import Machine
    from localfab.plan import Plan

log = logging.getLogger("localfab.runtime")


def resolve_model(name: str, paths: Paths) -> Path:
    """A GGUF path, the embedded test model's name, or a registered model name -> its file."""
    from localfab.store import Store

    store = Store(paths)
    path = store.resolve(name)
    store.touch(name)  # "last used" in `localfab list`; a no-op for plain paths
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


def plan_for(path: Path, **wishes: object) -> tuple[Plan, Machine]:
    """Plan the load of `path` on this machine; explicit wishes (-c, -ngl, -ctk...) override."""
    from localfab.facts import read_facts
    from localfab.hardware import probe_machine
    from localfab.plan import Wishes, plan

    facts = read_facts(path)
    machine = probe_machine()
    chosen = plan(facts, machine, Wishes(**{k: v for k, v in wishes.items() if v is not None}))  # type: ignore[arg-type]
    return chosen, machine


def load_model(path: Path, settings: EngineSettings) -> LoadedModel:
    """Load the engine and resolve its chat template."""
    from localfab.chat.prompt import PromptBuilder
    from localfab.engine import Engine

    engine = Engine(path, settings)
    prompts = PromptBuilder(engine)
    notices = [prompts.notice] if prompts.notice else []
    return LoadedModel(engine=engine, prompts=prompts, path=path, notices=notices)
