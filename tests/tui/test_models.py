"""The models screen: local models with their fit, and "chat with this"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, DataTable, Static, TabbedContent

from localfab.chat.history import History
from localfab.tui.app import AppDeps, LocalfabApp, make_app
from localfab.tui.local_backend import ChatOptions, LocalBackend
from localfab.tui.models import ModelRow
from localfab.tui.screens.chat import ChatScreen
from localfab.tui.screens.models import ModelsScreen
from localfab.tui.widgets.confirm import ConfirmDialog
from localfab.tui.widgets.pulls import PullItem, PullsPanel
from tests.fake_engine import FakeEngine, fake_loader
from tests.tui_models_support import FakeModels
from tests.tui_support import palette_shows, send, wait_for

pytestmark = pytest.mark.anyio


class Models:
    """Two models; the fit verdict says which model it judged."""

    def __init__(self) -> None:
        self.judged: list[str] = []

    def rows(self) -> list[ModelRow]:
        return [
            ModelRow("small", "241 MB", "Q4_K_M", "gemma3", "just now"),
            ModelRow("big", "4.1 GB", "Q4_K_M", "llama", "never"),
        ]

    def fit(self, row: ModelRow) -> str | None:
        self.judged.append(row.name)
        return {"small": "CPU 8k", "big": "too big"}[row.name]


async def test_with_no_model_the_app_opens_on_the_models_and_enter_chats(tmp_path: Path) -> None:
    history = History(tmp_path / "s.db")
    opened: list[str] = []
    engines: dict[str, FakeEngine] = {}

    def backend_for(name: str) -> LocalBackend:
        opened.append(name)
        engine = engines[name] = FakeEngine(reply=lambda prompt: f"this is {name}")
        return LocalBackend(fake_loader(engine, name=name), history, name, ChatOptions())

    models = Models()
    app = make_app(
        AppDeps(backend=None, history=history, models=models, backend_factory=backend_for)
    )
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        table = app.screen.query_one("#models-table", DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        await wait_for(pilot, lambda: str(table.get_cell("big", "fit")) == "too big")
        assert str(table.get_cell("small", "fit")) == "CPU 8k"
        assert str(table.get_cell("small", "size")) == "241 MB"
        table.focus()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
        assert opened == ["big"]
        assert app.chat.model_name == "big"
        await send(pilot, app, "hi")
        await wait_for(pilot, lambda: not app.chat.streaming and app.chat.replies_finished == 1)
        # Ctrl+O goes back to the models; choosing another closes this one and opens that.
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        table = app.screen.query_one("#models-table", DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        table.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
        assert opened == ["big", "small"]
        assert app.chat.model_name == "small"
        assert engines["big"].closed and not engines["small"].closed
    history.close()


# the catalog, pulls and removal, on the fake hub/store (tests/tui_models_support.py) ------------
async def open_models(pilot: Pilot[None], app: LocalfabApp) -> ModelsScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
    screen = app.screen
    assert isinstance(screen, ModelsScreen)
    await wait_for(pilot, lambda: screen.query_one("#models-table", DataTable).row_count == 2)
    return screen


def cell(screen: ModelsScreen, table: str, row: str, column: str) -> str:
    return str(screen.query_one(f"#{table}", DataTable).get_cell(row, column))


def info_text(panel: PullsPanel) -> str:
    return " | ".join(str(s.render()) for s in panel.query(".pull-info").results(Static))


def catalog_names(screen: ModelsScreen) -> list[str]:
    table = screen.query_one("#catalog-table", DataTable)
    return [str(k.value) for k in table.rows]


async def cursor_to(pilot: Pilot[None], screen: ModelsScreen, table_id: str, name: str) -> None:
    table = screen.query_one(f"#{table_id}", DataTable)
    table.focus()
    table.move_cursor(row=table.get_row_index(name))
    await pilot.pause()


def models_app(tmp_path: Path, fake: FakeModels, **kwargs: Any) -> tuple[LocalfabApp, History]:
    history = History(tmp_path / "s.db")
    return make_app(AppDeps(backend=None, history=history, models=fake, **kwargs)), history


async def test_catalog_shows_checking_then_each_fit_and_errors_per_row(tmp_path: Path) -> None:
    fake = FakeModels()
    fake.fits_gate.clear()
    app, history = models_app(tmp_path, fake)
    first, second, gated = fake.entries[0].name, fake.entries[1].name, fake.entries[4].name
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_models(pilot, app)
        await pilot.press("c")
        await wait_for(pilot, lambda: len(catalog_names(screen)) == 5)
        assert cell(screen, "catalog-table", first, "fit") == "checking…"
        # an interrupted earlier download shows what the next pull resumes from
        assert cell(screen, "catalog-table", second, "status") == "10.0 MiB kept"
        fake.fits_gate.set()
        await wait_for(pilot, lambda: cell(screen, "catalog-table", gated, "fit") == "can't check")
        await wait_for(pilot, lambda: cell(screen, "catalog-table", first, "fit") == "CPU 32k")
        assert cell(screen, "catalog-table", second, "fit") == "GPU 32k"
        # the row's error says what to do, in the detail line under the table
        await cursor_to(pilot, screen, "catalog-table", gated)
        detail = str(screen.query_one("#catalog-detail", Static).render())
        assert "gated" in detail and "HF_TOKEN" in detail
        assert screen.query_one("#catalog-detail").has_class("-error")
        await cursor_to(pilot, screen, "catalog-table", first)
        detail = str(screen.query_one("#catalog-detail", Static).render())
        assert fake.entries[0].repo in detail and "Enter downloads it" in detail
        # Ctrl+R checks again the rows that could not be checked (a token set, a network back)
        fake.remote[gated] = "CPU 4k"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: cell(screen, "catalog-table", gated, "fit") == "CPU 4k")
        assert screen.catalog.catalog_errors == {}
    history.close()


async def test_catalog_filter_narrows_the_list_and_escape_returns_to_it(tmp_path: Path) -> None:
    fake = FakeModels()
    app, history = models_app(tmp_path, fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_models(pilot, app)
        await pilot.press("slash")
        await wait_for(pilot, lambda: len(catalog_names(screen)) == 5)
        assert screen.focused is screen.query_one("#catalog-filter")
        await pilot.press(*"1.5b")
        await wait_for(pilot, lambda: catalog_names(screen) == ["qwen2.5:1.5b"])
        await pilot.press("ctrl+a", "ctrl+k", *"nothing-like-this")
        await wait_for(pilot, lambda: catalog_names(screen) == [])
        assert "No catalog model matches" in str(screen.query_one("#catalog-detail").render())
        await pilot.press("escape")  # leaves the filter, not the screen
        assert isinstance(app.screen, ModelsScreen)
        assert screen.focused is screen.query_one("#catalog-table")
    history.close()


async def test_pulls_queue_one_at_a_time_with_progress_and_each_can_be_cancelled(
    tmp_path: Path,
) -> None:
    fake = FakeModels()
    first, second, third = (e.name for e in fake.entries[:3])
    app, history = models_app(tmp_path, fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_models(pilot, app)
        await pilot.press("c")
        await wait_for(pilot, lambda: len(catalog_names(screen)) == 5)
        await cursor_to(pilot, screen, "catalog-table", first)
        await pilot.press("p")
        await wait_for(pilot, lambda: cell(screen, "catalog-table", first, "status") == "38%")
        panel = screen.query_one(PullsPanel)
        assert panel.display
        await wait_for(pilot, lambda: "150.0 MiB / 400.0 MiB" in info_text(panel))
        assert "12.5 MiB/s" in info_text(panel) and "20s left" in info_text(panel)
        # two more: they wait their turn
        await cursor_to(pilot, screen, "catalog-table", second)
        await pilot.press("p")
        await cursor_to(pilot, screen, "catalog-table", third)
        await pilot.press("enter")  # Enter on a model that is not here pulls it too
        await wait_for(pilot, lambda: cell(screen, "catalog-table", third, "status") == "queued")
        assert cell(screen, "catalog-table", second, "status") == "queued"
        # cancel a queued one: it never starts
        await pilot.press("x")
        await wait_for(pilot, lambda: cell(screen, "catalog-table", third, "status") == "cancelled")
        # the first completes: the local list gains it, the next queued one starts
        fake.pulls[first].release.set()
        await wait_for(
            pilot,
            lambda: (
                first in {str(k.value) for k in screen.query_one("#models-table", DataTable).rows}
            ),
        )
        await wait_for(pilot, lambda: cell(screen, "catalog-table", first, "status") == "here")
        await wait_for(pilot, lambda: cell(screen, "catalog-table", second, "status") == "38%")
        # cancel the running one with its Cancel button
        running = [i for i in panel.query(PullItem) if i.job.name == second][0]
        await pilot.click(running.query_one(Button))
        await wait_for(
            pilot, lambda: cell(screen, "catalog-table", second, "status") == "cancelled"
        )
        assert fake.pulled == [first]
        assert [(j.name, j.state) for j in fake.queue.jobs()] == [
            (first, "done"),
            (second, "cancelled"),
            (third, "cancelled"),
        ]
        assert third not in fake.pulls  # the cancelled queued pull never ran
        # pulling a model that is here already says how to chat with it
        await cursor_to(pilot, screen, "catalog-table", first)
        await pilot.press("p")
        assert len(fake.queue.jobs()) == 3
    fake.release_all()
    history.close()


async def test_a_failed_pull_says_what_to_do_and_the_app_stays_usable(tmp_path: Path) -> None:
    fake = FakeModels()
    name = fake.entries[0].name
    reason = (
        f"not enough disk space for {name}: it needs 379.4 MiB more, 12.0 MiB is free on "
        "/home/models: free some space (`localfab rm` models you do not use) or set "
        "LOCALFAB_HOME to a bigger disk"
    )
    fake.script(name, fail=reason).release.set()
    app, history = models_app(tmp_path, fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_models(pilot, app)
        await pilot.press("c")
        await wait_for(pilot, lambda: len(catalog_names(screen)) == 5)
        await cursor_to(pilot, screen, "catalog-table", name)
        await pilot.press("p")
        await wait_for(pilot, lambda: cell(screen, "catalog-table", name, "status") == "failed")
        await wait_for(pilot, lambda: any("disk space" in n.message for n in app._notifications))
        detail = str(screen.query_one("#catalog-detail").render())
        assert "LOCALFAB_HOME" in detail
        assert "LOCALFAB_HOME" in str(screen.query_one(PullsPanel).query_one(".pull-info").render())
        # a retry goes through
        fake.script(name).release.set()
        await pilot.press("p")
        await wait_for(pilot, lambda: cell(screen, "catalog-table", name, "status") == "here")
    history.close()


async def test_remove_asks_first_and_cancel_keeps_the_model(tmp_path: Path) -> None:
    fake = FakeModels()
    app, history = models_app(tmp_path, fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_models(pilot, app)
        await cursor_to(pilot, screen, "models-table", "small")
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert "Remove small and delete its files?" in str(
            app.screen.query_one(".dialog-body").render()
        )
        await pilot.press("enter")  # the focused button is Cancel: the safe answer
        await wait_for(pilot, lambda: app.screen is screen)
        assert fake.removed == []
        await pilot.press("delete")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        await pilot.click("#confirm-yes")
        await wait_for(pilot, lambda: screen.query_one("#models-table", DataTable).row_count == 1)
        assert fake.removed == ["small"]
        assert any("removed small" in n.message for n in app._notifications)
    history.close()


async def test_chat_with_a_catalog_model_that_is_here_and_palette_commands(tmp_path: Path) -> None:
    fake = FakeModels()
    here = fake.entries[2].name
    fake.local.append(ModelRow(here, "1.80 GiB", "Q4_K_M", "qwen2", "never"))
    opened: list[str] = []

    def backend_for(name: str) -> LocalBackend:
        opened.append(name)
        engine = FakeEngine(reply=lambda prompt: "hello")
        return LocalBackend(fake_loader(engine, name=name), history, name, ChatOptions())

    app, history = models_app(tmp_path, fake, backend_factory=backend_for)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await wait_for_models(pilot, app, rows=3)
        # the command palette lists the screen's actions
        names = [c[0] for c in screen.palette_commands()]
        assert {"Pull model", "Cancel download", "Remove model", "Chat with this model"} <= set(
            names
        )
        await pilot.press("ctrl+p")
        await pilot.press(*"Show catalog")
        await wait_for(pilot, lambda: palette_shows(app, "Show catalog"))
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: (
                app.screen is screen
                and screen.query_one("#models-tabs", TabbedContent).active == "catalog-pane"
            ),
        )
        await wait_for(pilot, lambda: len(catalog_names(screen)) == 5)
        assert cell(screen, "catalog-table", here, "status") == "here"
        await cursor_to(pilot, screen, "catalog-table", here)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
        assert opened == [here]
        assert fake.queue.jobs() == []  # Enter on a model that is here chats, it does not pull
    history.close()


async def wait_for_models(pilot: Pilot[None], app: LocalfabApp, *, rows: int) -> ModelsScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
    screen = app.screen
    assert isinstance(screen, ModelsScreen)
    await wait_for(pilot, lambda: screen.query_one("#models-table", DataTable).row_count == rows)
    return screen


async def test_a_download_goes_on_when_the_screen_closes_and_shows_again_on_return(
    tmp_path: Path,
) -> None:
    fake = FakeModels()
    name = fake.entries[0].name

    def backend_for(model: str) -> LocalBackend:
        engine = FakeEngine(reply=lambda prompt: "hello")
        return LocalBackend(fake_loader(engine, name=model), history, model, ChatOptions())

    app, history = models_app(tmp_path, fake, backend_factory=backend_for)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await open_models(pilot, app)
        await pilot.press("c")
        await wait_for(pilot, lambda: len(catalog_names(screen)) == 5)
        await cursor_to(pilot, screen, "catalog-table", name)
        await pilot.press("p")
        await wait_for(pilot, lambda: cell(screen, "catalog-table", name, "status") == "38%")
        # open a chat on a local model: the models screen closes, the download does not
        await pilot.press("l")
        await cursor_to(pilot, screen, "models-table", "small")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
        assert fake.queue.active(name) is not None
        await pilot.press("ctrl+o")
        again = await open_models(pilot, app)
        assert again is not screen
        panel = again.query_one(PullsPanel)
        await wait_for(pilot, lambda: "150.0 MiB / 400.0 MiB" in info_text(panel))
        fake.pulls[name].release.set()
        await wait_for(pilot, lambda: "pulled" in info_text(panel))
        table = again.query_one("#models-table", DataTable)
        await wait_for(pilot, lambda: name in {str(k.value) for k in table.rows})
    history.close()


async def test_with_no_local_model_the_screen_opens_on_the_catalog(tmp_path: Path) -> None:
    fake = FakeModels()
    fake.local.clear()
    app, history = models_app(tmp_path, fake)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        screen = app.screen
        assert isinstance(screen, ModelsScreen)
        tabs = screen.query_one("#models-tabs", TabbedContent)
        await wait_for(pilot, lambda: tabs.active == "catalog-pane")
        await wait_for(
            pilot, lambda: cell(screen, "catalog-table", "qwen2.5:3b", "fit") == "GPU 8k"
        )
        assert screen.focused is screen.query_one("#catalog-table")
        assert "No models yet" in str(screen.query_one("#models-hint", Static).render())
    history.close()
