"""The fit screen: how a model loads on this machine or a shipped hardware profile, as memory bars.

The controls (machine, context, KV cache type, GPU layers, flash attention) re-plan in a worker;
the model's header is read once and kept. "Load with this plan" asks the app to open the chat
with the same wishes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from localfab.errors import LocalfabError
from localfab.gguf.facts import ModelFacts
from localfab.machine.probes import Machine, load_profiles, machine_from_profile_name
from localfab.plan import DoesNotFit, Plan, Wishes, plan
from localfab.tui.plain import plain
from localfab.tui.widgets.membars import MemoryBars
from localfab.units import KV_CACHE_TYPES

THIS_MACHINE = "this machine"
AUTO = "auto"


def profile_names() -> list[str]:
    """The shipped hardware profiles, by name."""
    return list(load_profiles())


def default_machine(profile: str | None) -> Machine:
    """A shipped profile, or this machine (probed once per call; slow: call in a worker)."""
    if profile is not None:
        return machine_from_profile_name(profile)
    from localfab.runtime import probe_this_machine

    return probe_this_machine()


@dataclass(frozen=True)
class FitChoice:
    """What the controls ask for; None means "let the planner choose"."""

    profile: str | None = None
    n_ctx: int | None = None
    kv: str | None = None
    n_gpu_layers: int | None = None
    flash_attn: str = "auto"

    def wishes(self, base: Wishes) -> Wishes:
        return replace(
            base,
            n_ctx=self.n_ctx,
            min_ctx=min(base.min_ctx, self.n_ctx) if self.n_ctx else base.min_ctx,
            type_k=self.kv,
            type_v=self.kv,
            n_gpu_layers=self.n_gpu_layers,
            flash_attn=self.flash_attn,
        )


class FitScreen(Screen[None]):
    """The plan for one model, with controls that re-plan as they change."""

    CSS_PATH = "fit.tcss"  # loaded when the screen first opens

    BINDINGS = [
        Binding("escape", "back", "Back", id="fit.back"),
        Binding("ctrl+l", "load", "Load with this plan", id="fit.load"),
    ]

    @dataclass
    class LoadRequested(Message):
        """The user asked to open the chat on this model with these wishes."""

        model: str
        wishes: Wishes

    @dataclass
    class Planned(Message):
        """A plan came back from the worker (or the reason there is none)."""

        choice: FitChoice
        plan: Plan | None
        problem: str | None

    def __init__(
        self,
        model: str,
        facts: Callable[[], ModelFacts],
        *,
        machine: Callable[[str | None], Machine] = default_machine,
        profiles: Callable[[], list[str]] = profile_names,
        base: Wishes | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self._read_facts = facts
        self._machine = machine
        self._profiles = profiles
        self.base = base or Wishes()
        self._facts: ModelFacts | None = None
        # Workers of this group overlap (a thread cannot be cancelled): the first one to need the
        # header or a machine reads it while the others wait, so each is read once.
        self._reading = threading.Lock()
        self._machines: dict[str | None, Machine] = {}
        self.plan: Plan | None = None
        self.problem: str | None = None
        self.plans_made = 0

    def compose(self) -> ComposeResult:
        yield Label(f"Fit: {self.model}", id="fit-title", markup=False)
        with Horizontal(id="fit-controls"):
            with Vertical(classes="fit-control", id="fit-machine-control"):
                yield Label("Machine", markup=False)
                options = [(plain(THIS_MACHINE), THIS_MACHINE)] + [
                    (plain(p), p) for p in self._profiles()
                ]
                yield Select(
                    options, value=THIS_MACHINE, allow_blank=False, id="fit-machine", compact=True
                )
            with Vertical(classes="fit-control"):
                yield Label("Context", markup=False)
                yield Input(placeholder=AUTO, type="integer", id="fit-ctx", compact=True)
            with Vertical(classes="fit-control"):
                yield Label("KV cache", markup=False)
                kv = [(AUTO, AUTO)] + [(k, k) for k in KV_CACHE_TYPES]
                yield Select(kv, value=AUTO, allow_blank=False, id="fit-kv", compact=True)
            with Vertical(classes="fit-control"):
                yield Label("GPU layers", markup=False)
                yield Input(placeholder=AUTO, type="integer", id="fit-ngl", compact=True)
            with Vertical(classes="fit-control"):
                yield Label("Flash attn", markup=False)
                fa = [(v, v) for v in ("auto", "on", "off")]
                yield Select(fa, value="auto", allow_blank=False, id="fit-fa", compact=True)
        with VerticalScroll(id="fit-body"):
            yield Static("Planning…", id="fit-summary", markup=False)
            yield MemoryBars(id="fit-bars")
            yield Static("", id="fit-reasons", markup=False)
        with Horizontal(id="fit-actions"):
            yield Button(
                "Load with this plan", id="fit-load", variant="primary", disabled=True, compact=True
            )
        yield Footer()

    def on_mount(self) -> None:
        self.replan()

    def choice(self) -> FitChoice:
        """The controls' current values."""

        def number(widget_id: str) -> int | None:
            text = self.query_one(widget_id, Input).value.strip()
            try:
                return int(text) if text else None
            except ValueError:
                return None

        machine = self.query_one("#fit-machine", Select).value
        kv = self.query_one("#fit-kv", Select).value
        return FitChoice(
            profile=None if machine == THIS_MACHINE else str(machine),
            n_ctx=number("#fit-ctx"),
            kv=None if kv == AUTO else str(kv),
            n_gpu_layers=number("#fit-ngl"),
            flash_attn=str(self.query_one("#fit-fa", Select).value),
        )

    @on(Select.Changed)
    @on(Input.Changed)
    def _control_changed(self, event: Message) -> None:
        event.stop()
        self.replan()

    def replan(self) -> None:
        self._plan(self.choice())

    @work(thread=True, exclusive=True, group="fit", exit_on_error=False)
    def _plan(self, choice: FitChoice) -> None:
        try:
            with self._reading:
                if self._facts is None:
                    self._facts = self._read_facts()
                if choice.profile not in self._machines:
                    self._machines[choice.profile] = self._machine(choice.profile)
                facts, machine = self._facts, self._machines[choice.profile]
            result = plan(facts, machine, choice.wishes(self.base))
        except LocalfabError as exc:
            self.post_message(self.Planned(choice, None, str(exc)))
            return
        except Exception as exc:  # a broken file or probe: said on the screen, never a crash
            self.post_message(self.Planned(choice, None, f"cannot plan: {exc}"))
            return
        self.post_message(self.Planned(choice, result, None))

    @on(Planned)
    def _planned(self, event: Planned) -> None:
        if event.choice != self.choice():
            return  # the controls moved on; a newer plan is on its way
        self.plans_made += 1
        self.plan, self.problem = event.plan, event.problem
        summary = self.query_one("#fit-summary", Static)
        bars = self.query_one(MemoryBars)
        reasons = self.query_one("#fit-reasons", Static)
        load = self.query_one("#fit-load", Button)
        p = event.plan
        if p is None or not p.fits:
            why = event.problem
            if p is not None:
                why = str(DoesNotFit("; ".join(p.warnings) or f"{p.model} does not fit"))
                why += "".join(f"\n· {r}" for r in p.reasons)
            summary.update(f"Does not fit.\n{why}")
            summary.set_class(True, "-does-not-fit")
            bars.display = False
            reasons.update("")
            load.disabled = True
            return
        summary.set_class(False, "-does-not-fit")
        where = (
            f"{p.repeating_layers_on_gpu}/{p.n_layer} layers on {p.gpu}" if p.gpu else "CPU only"
        )
        fa = "on" if p.flash_attn else "off"
        summary.update(
            f"context {p.n_ctx} · KV {p.type_k}/{p.type_v} · {where} · flash attn {fa} · "
            f"~{p.predicted_tok_s:.0f} tok/s predicted"
        )
        bars.display = True
        bars.show(p.memory)
        lines = [f"· {r}" for r in p.reasons]
        lines += [f"! {w}" for w in p.warnings]
        lines += [f"cost: {c}" for c in p.costs]
        reasons.update("\n".join(lines))
        # A plan for another machine is for reading: the chat loads on this one.
        load.disabled = event.choice.profile is not None

    @on(Button.Pressed, "#fit-load")
    def _load_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_load()

    def action_load(self) -> None:
        choice = self.choice()
        if self.plan is None or not self.plan.fits or choice.profile is not None:
            self.notify(
                "Only a plan that fits this machine can be loaded.", severity="warning", timeout=4
            )
            return
        self.post_message(self.LoadRequested(self.model, choice.wishes(self.base)))

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()
