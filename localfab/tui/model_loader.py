"""Loading a model for the app: find it, plan it for this machine, load it with progress the
load panel shows, and what the plan chose in a few lines (`model_loader`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localfab.errors import LocalfabError, UsageError
from localfab.tui.backend import LoadProgress, ModelCard, ProgressCallback
from localfab.tui.cache_notes import attach_prompt_cache
from localfab.tui.local_backend import ChatModel, LoadCancelled, Loader

if TYPE_CHECKING:
    from localfab.config import Config, Paths
    from localfab.plan import Wishes
    from localfab.plan.projector import ProjectorPlan
    from localfab.runtime import ModelChoice


def model_loader(
    name: str,
    paths: Paths,
    config: Config,
    *,
    ctx_size: int | None = None,
    wishes: Wishes | None = None,
    template_file: Path | None = None,
    mmproj: Path | None = None,
) -> Loader:
    """The loader for a model name or path: resolve, plan for this machine, load.

    `wishes` (from the fit screen) replace the ones made from `config` and `ctx_size`;
    `template_file` is a chat template used instead of the model's (--chat-template-file);
    `mmproj` its vision projector (else one beside the model file is found: `find_projector`).
    """

    def load(progress: ProgressCallback, cancel: threading.Event) -> ChatModel:
        from localfab.runtime import choose_model, speculation_from, wishes_from_options

        progress(LoadProgress("finding and planning the model", 0.0, name))
        choice = choose_model(name, paths, wishes or wishes_from_options(config, ctx_size=ctx_size))
        choice, vision = plan_vision(choice, mmproj)  # before the load: it may need GPU room
        chosen, path = choice.plan, choice.path
        plan_lines = plan_summary(chosen)
        detail = " · ".join(plan_lines)
        progress(LoadProgress("loading weights", WEIGHTS_START, detail))
        if cancel.is_set():
            raise LoadCancelled()
        started = time.monotonic()
        # Speculative decoding as config.toml's [speculative] says (off unless set there).
        speculative = speculation_from(config, paths)
        loaded = choice.open(
            progress=weights_progress(progress, cancel, detail), speculative=speculative
        )
        if cancel.is_set():
            loaded.close()
            raise LoadCancelled()
        if template_file is not None:
            use_template(loaded, template_file)
        seeing = vision.attach(loaded)
        if seeing:
            loaded.notices.append(seeing)
        notes = attach_prompt_cache(loaded.engine, chosen, paths, config)
        progress(LoadProgress("ready", 1.0, f"loaded in {time.monotonic() - started:.1f} s"))
        info = ModelCard(
            name=name,
            path=str(path),
            n_ctx=loaded.engine.n_ctx,
            gpu_layers=chosen.repeating_layers_on_gpu,
            total_layers=chosen.n_layer,
            plan=tuple(plan_lines),
            notices=tuple(loaded.notices),
            threads=loaded.engine.n_threads,
        )
        return ChatModel(
            loaded.engine, loaded.prompts, info, loaded.close, plan=chosen, notes=notes
        )

    return load


UNUSABLE = "images off: the projector beside the model cannot be used ({})"


@dataclass(frozen=True)
class Vision:
    """The model's vision projector as planned with it, to attach once the model is loaded."""

    path: Path | None = None  # None: no projector (or one beside the model that cannot be used)
    placed: ProjectorPlan | None = None
    given: bool = False  # --mmproj named it (else it was found beside the model)
    note: str = ""  # why the one beside the model is not used

    def attach(self, loaded: Any) -> str:
        """Attach it where its plan put it; what to tell the user ("" for none). A projector
        given that cannot be used stops the load; one found beside the model only a note."""
        from localfab.engine.vision import attach_projector

        if self.path is None or self.placed is None:
            return self.note
        try:
            attach_projector(loaded.engine, self.path, use_gpu=self.placed.use_gpu)
        except LocalfabError as exc:
            if self.given:
                loaded.close()
                raise
            return UNUSABLE.format(exc)
        return f"reads images: {self.placed.describe()}; {self.placed.image_cost()}"


def plan_vision(choice: ModelChoice, mmproj: Path | None) -> tuple[ModelChoice, Vision]:
    """The model's vision projector (`mmproj`, or the one beside its file) planned with it
    before either loads, and the model's choice to load with it (`place_projector`)."""
    path = mmproj or choice.projector_beside()
    if path is None:
        return choice, Vision()
    try:
        together, placed = choice.place_projector(path)
    except LocalfabError as exc:
        if mmproj is not None:
            raise
        return choice, Vision(note=UNUSABLE.format(exc))
    return together, Vision(path, placed, given=mmproj is not None)


def use_template(loaded: Any, path: Path) -> None:
    """A chat template file in place of the model's own (its BOS and EOS kept); a load notice
    about the model's own template no longer applies."""
    from localfab.chat.prompt import PromptBuilder

    old = loaded.prompts.notice
    try:
        loaded.prompts = PromptBuilder.from_file(loaded.engine, path)
    except UsageError:
        loaded.close()
        raise
    loaded.notices = [n for n in loaded.notices if n != old]


# The share of the load bar before the weights start (finding and planning) and after they end
# (creating the context and warming up).
WEIGHTS_START = 0.05
WEIGHTS_END = 0.95


def weights_progress(
    progress: ProgressCallback, cancel: threading.Event, detail: str
) -> Callable[[float], bool]:
    """The engine's per-tensor load progress as the app's `LoadProgress`, stopped by `cancel`.

    llama.cpp reports every tensor (hundreds per model): only whole-percent steps are passed on,
    so the UI gets at most a hundred messages per load.
    """
    last = -1

    def on_weights(fraction: float) -> bool:
        nonlocal last
        if cancel.is_set():
            return False
        percent = int(fraction * 100)
        if percent != last:
            last = percent
            share = WEIGHTS_START + (WEIGHTS_END - WEIGHTS_START) * fraction
            progress(LoadProgress("loading weights", share, detail))
        return True

    return on_weights


def plan_summary(chosen: Any) -> list[str]:
    """A few short lines that say what the planner chose and why."""
    where = f"{chosen.repeating_layers_on_gpu}/{chosen.n_layer} layers on {chosen.gpu}"
    if not chosen.gpu:
        where = "CPU only"
    lines = [
        f"context {chosen.n_ctx}",
        f"KV {chosen.type_k}/{chosen.type_v}",
        where,
        f"~{chosen.predicted_tok_s:.0f} tok/s predicted",
    ]
    return lines + [str(r) for r in chosen.reasons[:2]]
