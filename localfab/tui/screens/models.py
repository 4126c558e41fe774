"""The models screen: local models with size, quant, architecture, last use and fit; Enter chats."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, Static

from localfab.tui.models import ModelRow, ModelSource

COLUMNS = ("Name", "Size", "Quant", "Arch", "Fit", "Last used")


class ModelsScreen(Screen[None]):
    """Pick a model to chat with."""

    BINDINGS = [
        Binding("escape", "back", "Back", id="models.back"),
        Binding("ctrl+r", "reload", "Reload", id="models.reload"),
    ]

    @dataclass
    class ModelChosen(Message):
        """The user picked a model to chat with."""

        name: str

    @dataclass
    class RowsLoaded(Message):
        rows: list[ModelRow]

    @dataclass
    class FitJudged(Message):
        name: str
        verdict: str

    def __init__(self, source: ModelSource) -> None:
        super().__init__()
        self.source = source
        self.rows: list[ModelRow] = []

    def compose(self) -> ComposeResult:
        yield Label("Models on this machine", id="models-title")
        yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)
        yield Static(
            "Enter chats with the model · `localfab pull NAME` downloads one · "
            "`localfab list --catalog` shows the curated ones",
            id="models-hint",
        )
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column.lower())
        self.action_reload()

    def action_reload(self) -> None:
        self._load_rows()

    @work(thread=True, exclusive=True, group="models", exit_on_error=False)
    def _load_rows(self) -> None:
        rows = self.source.rows()
        self.post_message(self.RowsLoaded(rows))
        for row in rows:
            try:
                verdict = self.source.fit(row)
            except Exception:  # a verdict is a nicety: the list stays usable without it
                verdict = None
            self.post_message(self.FitJudged(row.name, verdict or "-"))

    @on(RowsLoaded)
    def _rows_loaded(self, event: RowsLoaded) -> None:
        self.rows = event.rows
        table = self.query_one(DataTable)
        table.clear()
        for r in event.rows:
            table.add_row(r.name, r.size, r.quant, r.arch, "…", r.last_used, key=r.name)
        if not event.rows:
            self.query_one("#models-hint", Static).update(
                "No models yet: `localfab pull qwen2.5:1.5b` downloads one, "
                "`localfab add FILE.gguf` registers a file you have."
            )
        table.focus()

    @on(FitJudged)
    def _fit_judged(self, event: FitJudged) -> None:
        table = self.query_one(DataTable)
        if event.name in {str(k.value) for k in table.rows}:
            table.update_cell(event.name, "fit", event.verdict)

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.ModelChosen(str(event.row_key.value)))

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()
