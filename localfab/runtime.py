"""From a model name and the user's wishes to a loaded engine: the one path every front end uses."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localfab.config import Config, Paths, check_threads
from localfab.engine.types import ONE_THREAD_CELLS, EngineSettings, SpecSettings
from localfab.errors import LocalfabError, UsageError

if TYPE_CHECKING:
    from localfab.chat.prompt import PromptBuilder
    from localfab.engine import Engine
    from localfab.gguf.facts import ModelFacts
    from localfab.machine.probes import Machine
    from localfab.plan import Plan, Wishes
    from localfab.plan.projector import ProjectorPlan

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
    from localfab.machine.probes import probe_machine

    return probe_machine(backend_info=engine_backend_info)


def plan_for(path: Path, wishes: Wishes) -> tuple[Plan, Machine, ModelFacts]:
    """Plan the load of `path` on this machine (and the header facts it was planned from)."""
    from localfab.gguf.facts import read_facts
    from localfab.plan import plan

    facts, machine = read_facts(path), probe_this_machine()
    return plan(facts, machine, wishes), machine, facts


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
    wishes: Wishes | None = None  # what the user asked for (None: nothing pinned)
    # The model's header facts the plan was made from (None: read again when needed).
    facts: ModelFacts | None = field(default=None, compare=False, repr=False)

    def projector_beside(self) -> Path | None:
        """The vision projector beside the model's file (`find_projector`)."""
        return find_projector(self.path, self.facts)

    @property
    def settings(self) -> EngineSettings:
        return EngineSettings(**self.plan.settings_kwargs())

    def open(
        self,
        *,
        progress: Callable[[float], bool] | None = None,
        speculative: SpecSettings | None = None,
        parallel: int = 1,
        kv_unified: bool = False,
    ) -> LoadedModel:
        """Load the planned model (`progress` and `speculative` as in `load_model`); a draft
        model is placed beside it first (`place_draft`), and exact speculation on the CPU
        loads as `SpecSettings.load_settings` says (a cache type given with -ctk/-ctv stays).
        `parallel` sequences share the context (the server's slots), each with its share of
        it unless `kv_unified`."""
        notices: list[str] = []
        settings = replace(self.settings, n_seq_max=parallel, kv_unified=kv_unified)
        if speculative is not None and speculative.enabled:
            speculative, notice = self.place_draft(speculative)
            if notice:
                notices.append(notice)
        if speculative is not None:
            wishes = self.wishes
            pinned = wishes is not None and (wishes.type_k or wishes.type_v) is not None
            settings, notice = speculative.load_settings(settings, keep_cache=pinned)
            if notice:
                notices.append(notice)
        loaded = load_model(self.path, settings, progress=progress, speculative=speculative)
        loaded.notices[:0] = notices
        return loaded

    def place_draft(self, spec: SpecSettings) -> tuple[SpecSettings | None, str | None]:
        """`spec` with its draft model planned beside this model (GPU layers, unless -ngld
        gave them), and what to tell the user; a draft that fits nowhere leaves speculation
        off (None)."""
        if spec.spec_type != "draft-simple" or not spec.model_draft:
            return spec, None
        if spec.n_gpu_layers_draft is not None:
            return spec, None  # the user's -ngld stands
        from localfab.gguf.facts import read_facts
        from localfab.plan.draft import plan_draft

        path = Path(spec.model_draft)
        try:
            facts = read_facts(path)
        except (LocalfabError, OSError):
            return spec, None  # loading it says what is wrong, and the model runs without it
        placed = plan_draft(self.plan, facts, self.machine, name=path.name)
        if not placed.fits:
            return None, f"running without speculative decoding: {placed.describe()}"
        return replace(spec, n_gpu_layers_draft=placed.n_gpu_layers), placed.describe()

    def place_projector(
        self, path: Path, *, offload: bool = True
    ) -> tuple[ModelChoice, ProjectorPlan]:
        """The vision projector `path` planned with this model (before either loads), and the
        model's choice to load with it: with offload, the model planned again with the
        projector's room on the GPU kept first (`plan.projector.plan_together`). UsageError,
        in one line, for a file that is no projector or one that fits nowhere."""
        from localfab.gguf.facts import read_facts

        facts = self.facts or read_facts(self.path)
        together, placed = plan_with_projector(
            facts, self.plan, self.machine, self.wishes, path, offload=offload
        )
        if not placed.fits:
            raise UsageError(placed.describe())
        return replace(self, plan=together), placed


def plan_with_projector(
    facts: ModelFacts,
    target: Plan,
    machine: Machine,
    wishes: Wishes | None,
    path: Path,
    *,
    offload: bool,
) -> tuple[Plan, ProjectorPlan]:
    """The model (`facts`, planned as `target` for `wishes`) and the vision projector `path`
    planned together (it may fit nowhere: its plan says so); UsageError for a file that is no
    projector, or one the engine cannot use."""
    from localfab.gguf.projector import read_projector
    from localfab.plan import Wishes
    from localfab.plan.projector import plan_together

    try:
        proj = read_projector(path)
    except LocalfabError as exc:
        raise UsageError(f"--mmproj: {exc}") from exc
    if proj.grid_positions:
        raise UsageError(
            f"{path.name} is a {proj.projector_type} projector, which places images on a "
            "grid of positions (M-RoPE): not supported yet"
        )
    return plan_together(
        facts, target, proj, machine, wishes or Wishes(), name=path.name, offload=offload
    )


def find_projector(model: Path, facts: ModelFacts | None = None) -> Path | None:
    """The vision projector beside a model file: a `*mmproj*.gguf` in its folder (where `pull`
    puts a repository's) made for a model of its embedding size (or saying none), the one
    whose quant is closest to the model's first (as `pull` picks); None when none is.
    `facts`: the model's, where they were read already."""
    from localfab.gguf.facts import read_facts
    from localfab.gguf.projector import read_projector
    from localfab.hub.files import RemoteFile, pick_projector

    candidates = sorted(model.parent.glob("*mmproj*.gguf"))
    n_embd = (facts or read_facts(model)).n_embd if candidates else 0
    usable = []
    for candidate in candidates:
        try:
            if read_projector(candidate).projection_dim in (n_embd, 0):
                usable.append(RemoteFile(candidate.name, None, None))
        except (LocalfabError, OSError):
            continue
    best = pick_projector(model.name, usable)
    return model.parent / best.path if best is not None else None


def choose_model(
    name: str, paths: Paths, wishes: Wishes, *, require_fit: bool = True
) -> ModelChoice:
    """Find `name` (a path, the embedded model or a registered name) and plan it for this machine.

    With `require_fit`, a plan that does not fit raises (`Plan.require_fit`); without, the caller
    may show the plan first and call `choice.plan.require_fit()` itself.
    """
    path = resolve_model(name, paths)
    chosen, machine, facts = plan_for(path, wishes)
    if require_fit:
        chosen.require_fit()
    return ModelChoice(name, path, chosen, machine, wishes, facts)


def speculation_from(
    config: Config,
    paths: Paths | None = None,
    *,
    spec_type: str | None = None,
    model_draft: str | None = None,
    draft_max: int | None = None,
    draft_min: int | None = None,
    draft_p_min: float | None = None,
    gpu_layers_draft: int | None = None,
    spec_exact: bool | None = None,
) -> SpecSettings | None:
    """Speculative decoding from the flags, with config.toml's [speculative] as defaults.

    A draft model (-md) without --spec-type means draft-simple, as in llama-server. A draft
    given by a registered name is found in the store. None when speculation is off; a
    `UsageError` for a value it cannot use (--draft-max 0, draft-simple without -md).
    """
    table = dict(config.speculative)
    flags = {
        "spec_type": spec_type,
        "model_draft": model_draft,
        "draft_max": draft_max,
        "draft_min": draft_min,
        "draft_p_min": draft_p_min,
        "gpu_layers_draft": gpu_layers_draft,
        "spec_exact": spec_exact,
    }
    values = {**table, **{k: v for k, v in flags.items() if v is not None}}
    if "spec_type" not in values and values.get("model_draft"):
        values["spec_type"] = "draft-simple"
    kind = values.get("spec_type", "none")
    draft = values.get("model_draft") or None
    if draft and paths is not None and kind == "draft-simple":
        draft = _find_draft(draft, paths)
    spec = SpecSettings(
        spec_type=kind,
        model_draft=draft,
        draft_max=values.get("draft_max"),
        draft_min=values.get("draft_min", SpecSettings.draft_min),
        draft_p_min=values.get("draft_p_min", SpecSettings.draft_p_min),
        n_gpu_layers_draft=values.get("gpu_layers_draft"),
        exact=values.get("spec_exact", True),
    )
    spec.check()
    if kind != "draft-simple" and model_draft:
        raise UsageError(f"-md/--model-draft needs --spec-type draft-simple, not {kind}")
    return spec if spec.enabled else None


def _find_draft(name: str, paths: Paths) -> str:
    """A registered model's file for a draft given by name; the name itself otherwise."""
    if Path(name).expanduser().exists():
        return str(Path(name).expanduser())
    try:
        from localfab.store import Store

        return str(Store(paths).resolve(name))
    except LocalfabError:
        return name  # loading it says what is wrong, and the model runs without it


def start_speculation(engine: Engine, spec: SpecSettings) -> str:
    """Turn speculation on for `engine`, loading the draft model; returns what to tell the user.

    A draft model that cannot draft for this model (missing, corrupt, another vocabulary,
    larger than the model) leaves speculation off: the reply is still right, only not sped up.
    """
    draft = None
    if spec.spec_type == "draft-simple" and spec.model_draft:
        try:
            draft = engine.load_draft(spec.model_draft, spec.n_gpu_layers_draft)
        except LocalfabError as exc:
            return f"running without speculative decoding: {exc}"
    engine.set_speculation(spec, draft)
    n = engine.speculation_batch - 1
    if n < 1:
        engine.set_speculation(None)
        return (
            "running without speculative decoding: llama.cpp computes batches differently "
            "from single tokens with these settings (on the CPU, -fa on with a quantized KV "
            "cache computes them alike), so drafts could change the text "
            "(--no-spec-exact allows that)"
        )
    what = f"draft model {Path(spec.model_draft or '').name}" if draft else spec.spec_type
    said = f"speculative decoding with {what}, up to {min(n, spec.max_draft)} tokens per step"
    if engine.speculation_batch_past < engine.speculation_batch:
        past = engine.speculation_batch_past - 1
        said += (
            f" within the first {ONE_THREAD_CELLS} tokens of context, {past or 'none'} past them "
            "(llama.cpp computes one token's attention over an f16 KV cache differently there; "
            "-ctk q8_0 computes it alike)"
        )
    return said


def load_model(
    path: Path,
    settings: EngineSettings,
    *,
    progress: Callable[[float], bool] | None = None,
    speculative: SpecSettings | None = None,
) -> LoadedModel:
    """Load the engine and resolve its chat template.

    `progress` gets the fraction of the weights loaded; returning False cancels the load
    (`LoadCancelled`). With `speculative`, speculation is started (`start_speculation`).
    """
    from localfab.chat.prompt import PromptBuilder
    from localfab.engine import Engine

    engine = Engine(path, settings, progress=progress)
    prompts = PromptBuilder(engine)
    notices = [prompts.notice] if prompts.notice else []
    if speculative is not None and speculative.enabled:
        notices.append(start_speculation(engine, speculative))
    if engine.n_ctx_total != settings.n_ctx:
        notices.append(
            f"context {settings.n_ctx} became {engine.n_ctx_total} tokens "
            "(llama.cpp allocates the KV cache in steps of 256)"
        )
    if settings.n_ctx > engine.n_ctx_train > 0:
        notices.append(
            f"context {settings.n_ctx} is larger than the {engine.n_ctx_train} tokens the model "
            "was trained on; answers may degrade past that"
        )
    return LoadedModel(engine=engine, prompts=prompts, path=path, notices=notices)


class FitJudge:
    """Short fit verdicts ("GPU 8k", "20/29 GPU 4k", "CPU 8k", "too big") from the planner.

    The machine is probed once, on first use. A verdict is a nicety: if the planner, the probes
    or a header fail, the verdict is None and `localfab list` still works.
    """

    def __init__(self) -> None:
        self._machine: Any = None
        self._probed = False

    def machine(self) -> Any:
        if not self._probed:
            self._probed = True
            try:
                self._machine = probe_this_machine()
            except Exception:  # noqa: BLE001 - no verdicts rather than no list
                self._machine = None
        return self._machine

    def __call__(self, path: Path) -> str | None:
        result = self.plan(path)
        from localfab.plan.summary import summarise_plan

        return None if result is None else summarise_plan(result)

    def plan(self, path: Path) -> Any:
        """The planner's `Plan` for the file on this machine, or None."""
        try:
            from localfab.gguf.facts import read_facts
            from localfab.plan import Wishes, plan
        except ImportError:
            return None
        machine = self.machine()
        if machine is None:
            return None
        try:
            return plan(read_facts(path), machine, Wishes())
        except Exception:  # noqa: BLE001 - see the class docstring
            return None
