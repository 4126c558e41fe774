"""The models screen's "Remote servers" tab: the models each configured remote server serves
(`[remotes.NAME]` of config.toml, and the app's --remote), listed in a worker; Enter opens a chat
on one."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from localfab.remote.listing import RemoteRow
from localfab.tui.models import ListsRemotes
from localfab.tui.plain import plain_cell

REMOTE_COLUMNS = (("Server", 18), ("Model", 34), ("Details", None))
HINT = "Enter chats with the model on its server · Ctrl+R asks again"
NONE_HINT = (
    "No remote servers: add [remotes.NAME] with url = ... to config.toml, or start with "
    "`localfab chat --remote URL`"
)


class RemotePane(Vertical):
    """The remote servers' models (see the module's docstring)."""

    DEFAULT_CSS = """
    RemotePane #remote-table { height: 1fr; }
    RemotePane #remote-hint { color: $text-muted; padding: 0 1; }
    """

    @dataclass
    class Chosen(Message):
        choice: str  # "model@server"

    @dataclass
    class Listed(Message):
        rows: list[RemoteRow]

    def __init__(self, source: ListsRemotes | None, **kwargs: str) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.source = source
        self.rows: list[RemoteRow] = []
        self.loaded = False

    def compose(self) -> ComposeResult:
        yield DataTable(id="remote-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="remote-hint", markup=False)

    def on_mount(self) -> None:
        table = self.query_one("#remote-table", DataTable)
        for title, width in REMOTE_COLUMNS:
            table.add_column(plain_cell(title), key=title.lower(), width=width)

    def load(self) -> None:
        """List the servers' models (again)."""
        if self.source is None:
            self.query_one("#remote-hint", Static).update(NONE_HINT)
            return
        self.loaded = True
        self.query_one("#remote-hint", Static).update("Asking the servers for their models…")
        self._list()

    @work(thread=True, exclusive=True, group="remotes", exit_on_error=False)
    def _list(self) -> None:
        assert self.source is not None
        self.post_message(self.Listed(self.source.remote_rows()))

    @on(Listed)
    def _listed(self, event: Listed) -> None:
        self.rows = event.rows
        table = self.query_one("#remote-table", DataTable)
        table.clear()
        for i, row in enumerate(event.rows):
            model = row.model or "—"
            table.add_row(
                plain_cell(row.server), plain_cell(model), plain_cell(row.detail), key=str(i)
            )
        self.query_one("#remote-hint", Static).update(HINT if event.rows else NONE_HINT)

    @on(DataTable.RowSelected, "#remote-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        index = int(str(event.row_key.value))
        row = self.rows[index] if index < len(self.rows) else None
        if row is not None and row.choice:
            self.post_message(self.Chosen(row.choice))
        elif row is not None:
            self.notify(f"{row.server}: {row.detail}", severity="warning", timeout=6)
