"""The fit screen: a model's plan as memory bars, controls that re-plan, and loading with it."""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.gguf.facts import ModelFacts, read_facts
from localfab.machine.probes import Machine, load_model_specs, machine_from_profile_name
from localfab.plan import DeviceMemory, Wishes
from localfab.tui.app import AppDeps, LocalfabApp, make_app
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.screens.chat import ChatScreen
from localfab.tui.screens.fit import FitScreen
from localfab.tui.widgets.membars import MemoryBars, segment_widths
from localfab.units import GiB, MiB
from tests.fake_engine import FakeEngine, fake_loader
from tests.gguf_fixtures import synthetic_source
from tests.tui_support import wait_for

pytestmark = pytest.mark.anyio

GPU_PROFILE = "rtx3060-laptop-6gb"
CPU_PROFILE = "cpu-only-16gb"
SIZES = [(100, 30), (80, 24)]
THEMES = ["localfab-dark", "localfab-light"]


@cache
def facts(spec: str) -> ModelFacts:
    return read_facts(synthetic_source(load_model_specs()[spec], name=spec))


class Reads:
    """Counts header reads, so a test can see the facts are read once."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.count = 0

    def __call__(self, name: str) -> ModelFacts:
        self.count += 1
        return facts(self.spec)


def gpu_machine(profile: str | None) -> Machine:
    """'This machine' is the 6 GB laptop GPU, so tests never probe the real one."""
    return machine_from_profile_name(profile or GPU_PROFILE)


def fit_app(
    tmp_path: Path,
    *,
    spec: str = "Llama-3.1-8B-Instruct",
    theme: str | None = None,
    opened: list[tuple[str, Wishes | None]] | None = None,
) -> tuple[LocalfabApp, Reads]:
    history = History(tmp_path / "s.db")
    reads = Reads(spec)

    def backend_for(name: str, wishes: Wishes | None = None) -> LocalBackend:
        if opened is not None:
            opened.append((name, wishes))
        return LocalBackend(fake_loader(FakeEngine(), name=name), history, name, ChatOptions())

    app = make_app(
        AppDeps(
            backend=backend_for("llama-8b"),
            history=history,
            model_name="llama-8b",
            theme=theme,
            backend_factory=backend_for,
            facts_for=reads,
        )
    )
    if opened is not None:
        opened.clear()
    return app, reads


def fit_screen(app: LocalfabApp, machine=gpu_machine) -> FitScreen:
    """Open the fit screen on a machine the test controls."""
    assert app.model_name is not None
    screen = FitScreen(app.model_name, lambda: facts("Llama-3.1-8B-Instruct"), machine=machine)
    return screen


async def planned(pilot, screen: FitScreen, before: int) -> None:
    await wait_for(pilot, lambda: screen.plans_made > before and not screen.workers)


def test_segments_fill_the_bar_and_show_every_part() -> None:
    memory = DeviceMemory(
        device="GPU",
        kind="cuda",
        available=6 * GiB,
        weights=4 * GiB,
        kv=512 * MiB,
        compute=1 * MiB,
        reserve=300 * MiB,
    )
    cells = dict(segment_widths(memory, 60))
    assert sum(cells.values()) == 60
    assert cells["compute"] == 1  # tiny but present
    assert cells["weights"] > cells["kv"] > 0 and cells["free"] > 0
    over = DeviceMemory("GPU", "cuda", 2 * GiB, 4 * GiB, 0, 0, 0)
    assert dict(segment_widths(over, 40)) == {
        "weights": 40,
        "kv": 0,
        "compute": 0,
        "reserve": 0,
        "free": 0,
    }


async def test_controls_replan_and_change_the_bars(tmp_path: Path) -> None:
    app, _ = fit_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = fit_screen(app)
        await app.push_screen(screen)
        await planned(pilot, screen, 0)
        first = screen.plan
        assert first is not None and first.fits
        bars = screen.query_one(MemoryBars)
        assert bars.display and [m.device for m in bars.memory] == [m.device for m in first.memory]
        kv_before = sum(m.kv for m in first.memory)

        n = screen.plans_made
        screen.query_one("#fit-ctx").value = "32768"
        await planned(pilot, screen, n)
        assert screen.plan is not None and screen.plan.n_ctx == 32768
        assert sum(m.kv for m in bars.memory) > kv_before

        n = screen.plans_made
        screen.query_one("#fit-kv").value = "q4_0"
        await planned(pilot, screen, n)
        assert screen.plan is not None and screen.plan.type_k == "q4_0"
        assert screen.plan.flash_attn  # a quantized V cache needs flash attention

        n = screen.plans_made
        screen.query_one("#fit-ngl").value = "10"
        await planned(pilot, screen, n)
        assert screen.plan is not None and screen.plan.n_gpu_layers == 10
        gpu = next(m for m in bars.memory if m.kind != "cpu")
        cpu = next(m for m in bars.memory if m.kind == "cpu")
        assert cpu.weights > gpu.weights  # most layers left on the CPU
        text = str(bars.render())
        assert "weights" in text and "free" in text


async def test_a_plan_that_does_not_fit_says_why_instead_of_bars(tmp_path: Path) -> None:
    app, _ = fit_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = fit_screen(app)
        await app.push_screen(screen)
        await planned(pilot, screen, 0)
        n = screen.plans_made
        screen.query_one("#fit-ctx").value = "131072"
        screen.query_one("#fit-kv").value = "f32"
        screen.query_one("#fit-fa").value = "off"
        await planned(pilot, screen, n)
        await wait_for(pilot, lambda: screen.plan is not None and not screen.plan.fits)
        assert not screen.query_one(MemoryBars).display
        summary = str(screen.query_one("#fit-summary").render())
        assert summary.startswith("Does not fit")
        assert screen.query_one("#fit-load").disabled


async def test_a_shipped_profile_plans_for_that_machine_and_is_not_loadable(
    tmp_path: Path,
) -> None:
    app, _ = fit_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = fit_screen(app)
        await app.push_screen(screen)
        await planned(pilot, screen, 0)
        assert screen.plan is not None and screen.plan.gpu
        assert not screen.query_one("#fit-load").disabled
        n = screen.plans_made
        screen.query_one("#fit-machine").value = CPU_PROFILE
        await planned(pilot, screen, n)
        assert screen.plan is not None and screen.plan.gpu is None
        assert [m.kind for m in screen.plan.memory] == ["cpu"]
        assert screen.query_one("#fit-load").disabled


async def test_fit_key_reads_the_header_once_and_load_opens_the_chat(tmp_path: Path) -> None:
    opened: list[tuple[str, Wishes | None]] = []
    app, reads = fit_app(tmp_path, opened=opened)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, FitScreen))
        screen = app.screen
        assert isinstance(screen, FitScreen) and screen.model == "llama-8b"
        # 'This machine' would probe the real one: read a profile instead.
        screen._machine = gpu_machine
        screen.replan()
        await planned(pilot, screen, 0)
        for ctx in ("8192", "4096"):
            n = screen.plans_made
            screen.query_one("#fit-ctx").value = ctx
            await planned(pilot, screen, n)
        assert reads.count == 1
        await pilot.press("ctrl+l")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
        assert len(opened) == 1
        name, wishes = opened[0]
        assert name == "llama-8b" and wishes is not None and wishes.n_ctx == 4096


async def test_controls_changed_while_the_header_is_read_wait_for_that_one_read(
    tmp_path: Path,
) -> None:
    app, _ = fit_app(tmp_path)
    reading, release = threading.Event(), threading.Event()
    reads: list[str] = []

    def slow_facts() -> ModelFacts:  # a header on a slow disk or a remote host
        reads.append("read")
        reading.set()
        release.wait(10)
        return facts("Llama-3.1-8B-Instruct")

    async with app.run_test(size=(100, 30)) as pilot:
        screen = FitScreen("llama-8b", slow_facts, machine=gpu_machine)
        await app.push_screen(screen)
        await wait_for(pilot, reading.is_set)
        for ctx in ("8192", "4096"):  # each starts another worker while the first still reads
            screen.query_one("#fit-ctx").value = ctx
            await pilot.pause()
        release.set()
        await planned(pilot, screen, 0)
        assert reads == ["read"]
        assert screen.plan is not None and screen.plan.n_ctx == 4096


async def test_fit_from_the_models_screen_is_for_the_selected_model(tmp_path: Path) -> None:
    from localfab.tui.models import ModelRow
    from localfab.tui.screens.models import ModelsScreen

    class Models:
        def rows(self) -> list[ModelRow]:
            return [
                ModelRow("small", "241 MB", "Q4_K_M", "gemma3", "just now"),
                ModelRow("big", "4.1 GB", "Q4_K_M", "llama", "never"),
            ]

        def fit(self, row: ModelRow) -> str | None:
            return None

    history = History(tmp_path / "s.db")
    asked: list[str] = []

    def facts_for(name: str) -> ModelFacts:
        asked.append(name)
        return facts("Llama-3.1-8B-Instruct")

    app = make_app(AppDeps(backend=None, history=history, models=Models(), facts_for=facts_for))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        table = app.screen.query_one("#models-table")
        await wait_for(pilot, lambda: table.row_count == 2)
        await pilot.press("down", "f4")
        await wait_for(pilot, lambda: isinstance(app.screen, FitScreen))
        assert app.screen.model == "big"
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
    history.close()


async def test_fit_and_settings_are_in_the_command_palette(tmp_path: Path) -> None:
    app, _ = fit_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Fit" in titles and "Settings" in titles


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fit_screen_snapshot(snap_compare, tmp_path, size, theme):
    app, _ = fit_app(tmp_path, theme=theme)

    async def ready(pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
        screen = fit_screen(app)
        await app.push_screen(screen)
        await planned(pilot, screen, 0)
        screen.query_one("#fit-ctx").value = "32768"
        await planned(pilot, screen, 1)
        app.set_focus(None)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=ready)


def test_the_model_loader_plans_with_the_fit_screens_wishes(monkeypatch, tmp_path: Path) -> None:
    """Wishes given to the loader replace those from the config (and an unfit plan stops it)."""
    import threading

    from localfab import runtime
    from localfab.config import Config, Paths
    from localfab.plan import DoesNotFit, plan
    from localfab.tui.model_loader import model_loader

    asked: list[Wishes] = []

    def plan_for(path: Path, wishes: Wishes):
        asked.append(wishes)
        machine = machine_from_profile_name(CPU_PROFILE)
        model = facts("Llama-3.1-8B-Instruct")
        return plan(model, machine, wishes), machine, model

    monkeypatch.setattr(runtime, "resolve_model", lambda name, paths: tmp_path / "m.gguf")
    monkeypatch.setattr(runtime, "plan_for", plan_for)
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "k")
    wishes = Wishes(n_ctx=131072, type_k="f32", type_v="f32", flash_attn="off")
    load = model_loader("m", paths, Config(), ctx_size=4096, wishes=wishes)
    with pytest.raises(DoesNotFit):
        load(lambda progress: None, threading.Event())
    assert asked == [wishes]
    load = model_loader("m", paths, Config(), ctx_size=131072)
    with pytest.raises(DoesNotFit):
        load(lambda progress: None, threading.Event())
    assert asked[1].n_ctx == 131072 and asked[1].type_k is None
