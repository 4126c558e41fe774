"""The models screen: local models with their fit, and "chat with this"."""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab.chat.history import History
from localfab.tui.app import make_app
from localfab.tui.backend import ChatOptions, LocalBackend
from localfab.tui.fake import FakeEngine, fake_loader
from localfab.tui.models import ModelRow
from localfab.tui.screens.chat import ChatScreen
from localfab.tui.screens.models import ModelsScreen
from tests.tui_support import send, wait_for

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


async def test_with_no_model_the_app_opens_on_the_models_and_enter_chats(tmp_path: Path):
    history = History(tmp_path / "s.db")
    opened: list[str] = []
    engines: dict[str, FakeEngine] = {}

    def backend_for(name: str) -> LocalBackend:
        opened.append(name)
        engine = engines[name] = FakeEngine(reply=lambda prompt: f"this is {name}")
        return LocalBackend(fake_loader(engine, name=name), history, name, ChatOptions())

    models = Models()
    app = make_app(backend=None, history=history, models=models, backend_factory=backend_for)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
        table = app.screen.query_one("#models-table")
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
        table = app.screen.query_one("#models-table")
        await wait_for(pilot, lambda: table.row_count == 2)
        table.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.chat.loaded)
        assert opened == ["big", "small"]
        assert app.chat.model_name == "small"
        assert engines["big"].closed and not engines["small"].closed
    history.close()
