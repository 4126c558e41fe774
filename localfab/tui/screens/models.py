"""The models screen: local models with their fit, the curated catalog with fit before download,
pulls with progress and a queue, removal, and "chat with this".

The local list comes from a `ModelSource`; the catalog, pulls and removal from `ModelActions`
(when the source offers them). Everything slow (fit verdicts, header reads on the hub, the store)
runs in workers; downloads run on the app-wide `PullQueue`, so they go on when the screen closes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label, Static, TabbedContent, TabPane

from localfab.errors import LocalfabError
from localfab.tui.downloads import PullJob
from localfab.tui.models import ListsRemotes, ModelActions, ModelRow, ModelSource
from localfab.tui.plain import plain_cell
from localfab.tui.screens.chat_parts import ListedCommands
from localfab.tui.widgets.catalog_pane import WIDTHS, CatalogPane, cursor_key, restore_cursor
from localfab.tui.widgets.confirm import ConfirmDialog
from localfab.tui.widgets.pulls import PullsPanel
from localfab.tui.widgets.remote_pane import RemotePane

COLUMNS = ("Name", "Size", "Quant", "Arch", "Fit", "Last used")

Command = tuple[str, str, Callable[[], object]]


class ModelsCommands(ListedCommands):
    """The models screen's actions in the command palette."""

    def _commands(self) -> list[Command]:
        screen = self.screen
        return screen.palette_commands() if isinstance(screen, ModelsScreen) else []


class ModelsScreen(Screen[None]):
    """Local models to chat with, the catalog to download from, and the downloads."""

    CSS_PATH = "models.tcss"  # loaded when the screen first opens

    DEFAULT_CSS = """
    ModelsScreen #models-tabs {
        height: 1fr;
    }
    ModelsScreen TabPane {
        padding: 0;
        height: 1fr;
    }
    ModelsScreen #catalog-table {
        height: 1fr;
    }
    ModelsScreen #catalog-filter {
        margin: 1 1 0 1;
    }
    ModelsScreen #catalog-detail {
        color: $text-muted;
        padding: 0 1;
        height: auto;
        max-height: 4;
    }
    ModelsScreen #catalog-detail.-error {
        color: $text-error;
    }
    """

    BINDINGS = [
        Binding("escape", "back", "Back", id="models.back"),
        Binding("ctrl+r", "reload", "Reload", id="models.reload", show=False),
        Binding("l", "show_local", "Local", id="models.local", show=False),
        Binding("c", "show_catalog", "Catalog", id="models.catalog"),
        Binding("r", "show_remote", "Remote", id="models.remote", show=False),
        Binding("slash", "filter", "Filter", id="models.filter", show=False),
        Binding("p", "pull", "Pull", id="models.pull"),
        Binding("x", "cancel_pull", "Cancel pull", id="models.cancel"),
        Binding("delete,d", "remove", "Remove", id="models.remove"),
    ]
    COMMANDS = {ModelsCommands}

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

    @dataclass
    class PullChanged(Message):
        """A download changed (progress, start, end); newer news of one job replaces older."""

        job: PullJob

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, ModelsScreen.PullChanged) and message.job.id == self.job.id

    @dataclass
    class Removed(Message):
        name: str
        message: str
        error: bool = False

    def __init__(self, source: ModelSource, actions: ModelActions | None = None) -> None:
        super().__init__()
        self.source = source
        if actions is None and isinstance(source, ModelActions):
            actions = source
        self.actions = actions
        self.rows: list[ModelRow] = []
        self._listed = False
        self._unsubscribe: Callable[[], None] | None = None

    # layout -------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Label("Models", id="models-title", markup=False)
        with TabbedContent(id="models-tabs", initial="local-pane"):
            with TabPane("On this machine", id="local-pane"):
                yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)
                yield Static(self._local_hint(), id="models-hint", markup=False)
            with TabPane("Catalog", id="catalog-pane", disabled=self.actions is None):
                yield CatalogPane(self.actions, id="catalog")
            with TabPane("Remote servers", id="remote-pane"):
                yield RemotePane(self._remotes(), id="remotes")
        yield PullsPanel(id="pulls")
        yield Footer()

    @property
    def catalog(self) -> CatalogPane:
        return self.query_one(CatalogPane)

    def _remotes(self) -> ListsRemotes | None:
        """The source's remote servers (None: it has none)."""
        source = self.source
        if isinstance(source, ListsRemotes) and getattr(source, "remotes", True):
            return source
        return None

    @on(RemotePane.Chosen)
    def _remote_chosen(self, event: RemotePane.Chosen) -> None:
        self.post_message(self.ModelChosen(event.choice))

    def action_show_remote(self) -> None:
        self.query_one(TabbedContent).active = "remote-pane"
        self.query_one("#remote-table", DataTable).focus()

    @on(CatalogPane.Loaded)
    def _catalog_loaded(self) -> None:
        if self._tab() == "catalog-pane":
            self.catalog.start_fit_checks()

    @on(DataTable.RowSelected, "#catalog-table")
    def _catalog_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        row = self.catalog.current_row()
        if row is not None and row.local:
            self.post_message(self.ModelChosen(row.local))
        else:
            self.action_pull()

    def _local_hint(self) -> str:
        if self.actions is None:
            return "Enter chats with the model · `localfab pull NAME` downloads one"
        return "Enter chats with the model · Del removes it · C: the catalog, to download more"

    def on_mount(self) -> None:
        table = self.query_one("#models-table", DataTable)
        for column in COLUMNS:
            table.add_column(plain_cell(column), key=column.lower(), width=WIDTHS.get(column))
        self._refresh_lists()
        if self.actions is not None:
            queue = self.actions.downloads
            panel = self.query_one(PullsPanel)
            for job in queue.jobs():
                panel.show(job)
            self._unsubscribe = queue.subscribe(self._queue_changed)

    def _queue_changed(self, job: PullJob) -> None:
        """From the download thread: pass the news to the event loop."""
        self.post_message(self.PullChanged(job))

    def on_unmount(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    # local models -------------------------------------------------------------------------------
    def action_reload(self) -> None:
        """Read both lists again, and check again the fits that could not be checked."""
        self._refresh_lists()
        self.catalog.recheck()
        if self._tab() == "remote-pane":
            self.query_one(RemotePane).load()

    def _refresh_lists(self) -> None:
        self._load_rows()
        if self.actions is not None:
            self.catalog.load()

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
        table = self.query_one("#models-table", DataTable)
        keep = cursor_key(table)
        table.clear()
        for r in event.rows:
            table.add_row(
                *(plain_cell(c) for c in (r.name, r.size, r.quant, r.arch, "…", r.last_used)),
                key=r.name,
            )
        restore_cursor(table, keep)
        hint = self.query_one("#models-hint", Static)
        if not event.rows:
            hint.update(
                "No models yet: C opens the catalog to download one, "
                "`localfab add FILE.gguf` registers a file you have."
            )
        else:
            hint.update(self._local_hint())
        first, self._listed = not self._listed, True
        if first and not event.rows and self.actions is not None:
            self.action_show_catalog()  # nothing here yet: the catalog is where to start
        elif self._tab() == "local-pane":
            table.focus()

    @on(FitJudged)
    def _fit_judged(self, event: FitJudged) -> None:
        table = self.query_one("#models-table", DataTable)
        if event.name in {str(k.value) for k in table.rows}:
            table.update_cell(event.name, "fit", plain_cell(event.verdict))

    @on(DataTable.RowSelected, "#models-table")
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.ModelChosen(str(event.row_key.value)))

    # downloads ----------------------------------------------------------------------------------
    def action_pull(self) -> None:
        """Download the catalog model under the cursor (queued behind any running pull)."""
        if self.actions is None:
            self.notify("Downloads need the catalog: `localfab pull NAME`.", severity="warning")
            return
        row = self.catalog.current_row() if self._tab() == "catalog-pane" else None
        if row is None:
            self.action_show_catalog()
            self.notify("Choose a model in the catalog, then press P or Enter.", timeout=4)
            return
        if row.local:
            self.notify(f"{row.name} is already here as {row.local}: Enter opens a chat with it.")
            return
        try:
            self.actions.downloads.add(row.name)
        except LocalfabError as exc:
            self.notify(str(exc), severity="warning")

    def action_cancel_pull(self) -> None:
        """Cancel the pull of the catalog model under the cursor, else the running one."""
        if self.actions is None:
            return
        queue = self.actions.downloads
        row = self.catalog.current_row() if self._tab() == "catalog-pane" else None
        if row is not None and queue.active(row.name) is not None:
            queue.cancel(row.name)
            return
        running = [j for j in queue.jobs() if j.state == "running"]
        if running:
            queue.cancel(running[0].name)
        else:
            self.notify("No download is running.", timeout=3)

    @on(PullsPanel.CancelPressed)
    def _cancel_pressed(self, event: PullsPanel.CancelPressed) -> None:
        if self.actions is not None:
            self.actions.downloads.cancel(event.name)

    @on(PullChanged)
    def _pull_changed(self, event: PullChanged) -> None:
        job = event.job
        self.query_one(PullsPanel).show(job)
        self.refresh_bindings()
        self.catalog.pull_changed(job)
        if job.state == "done":
            self.notify(job.message, title="Download finished", timeout=6)
            self._refresh_lists()
        elif job.state == "failed":
            self.notify(
                job.message, title=f"Could not pull {job.name}", severity="error", timeout=15
            )
        elif job.state == "cancelled":
            self.notify(f"{job.name}: {job.message}", timeout=5)

    def action_clear_downloads(self) -> None:
        if self.actions is not None:
            self.actions.downloads.clear_finished()
        self.query_one(PullsPanel).clear_finished()

    # removal ------------------------------------------------------------------------------------
    def action_remove(self) -> None:
        """Remove the local model under the cursor, after a confirmation."""
        if self._tab() != "local-pane":
            self.notify("Removal works on the models on this machine (L shows them).", timeout=4)
            return
        if self.actions is None:
            self.notify("Remove models with `localfab rm NAME`.", severity="warning")
            return
        name = cursor_key(self.query_one("#models-table", DataTable))
        if name is None:
            return
        self._ask_removal(name)

    @work(thread=True, group="remove", exit_on_error=False)
    def _ask_removal(self, name: str) -> None:
        assert self.actions is not None
        try:
            question = self.actions.removal_question(name)
        except LocalfabError as exc:
            self.post_message(self.Removed(name, str(exc), error=True))
            return
        if name == getattr(self.app, "model_name", None):
            question += " It is open in the chat, which keeps working until you switch models."
        self.app.call_from_thread(self._confirm_removal, name, question)

    def _confirm_removal(self, name: str, question: str) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self._remove(name)

        self.app.push_screen(ConfirmDialog(f"Remove {name}", question), answered)

    @work(thread=True, group="remove", exit_on_error=False)
    def _remove(self, name: str) -> None:
        assert self.actions is not None
        try:
            self.post_message(self.Removed(name, self.actions.remove(name)))
        except LocalfabError as exc:
            self.post_message(self.Removed(name, str(exc), error=True))
        except OSError as exc:
            self.post_message(
                self.Removed(name, f"could not delete the files of {name}: {exc}", error=True)
            )

    @on(Removed)
    def _removed(self, event: Removed) -> None:
        if event.error:
            self.notify(event.message, title=f"Could not remove {event.name}", severity="error")
        else:
            self.notify(event.message, timeout=6)
        self._refresh_lists()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Show each key only where it does something (the footer follows the tab)."""
        if action in ("pull", "show_catalog", "filter", "remove", "cancel_pull"):
            if self.actions is None:
                return False
            if action == "pull":
                return self._tab() == "catalog-pane"
            if action == "remove":
                return self._tab() == "local-pane"
            if action == "cancel_pull":
                return any(not j.finished for j in self.actions.downloads.jobs())
        return True

    # tabs and focus -----------------------------------------------------------------------------
    def _tab(self) -> str:
        tabs = self.query(TabbedContent)
        return tabs.first().active if tabs else "local-pane"

    def action_show_local(self) -> None:
        self.query_one(TabbedContent).active = "local-pane"
        self.query_one("#models-table", DataTable).focus()

    def action_show_catalog(self) -> None:
        if self.actions is None:
            self.notify("The catalog is not available here: `localfab list --catalog`.")
            return
        self.query_one(TabbedContent).active = "catalog-pane"
        self.query_one("#catalog-table", DataTable).focus()
        self.catalog.start_fit_checks()

    def action_filter(self) -> None:
        if self.actions is None:
            return
        self.query_one(TabbedContent).active = "catalog-pane"
        self.query_one("#catalog-filter", Input).focus()
        self.catalog.start_fit_checks()

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.refresh_bindings()
        if event.pane.id == "catalog-pane":
            self.catalog.start_fit_checks()
        elif event.pane.id == "remote-pane" and not self.query_one(RemotePane).loaded:
            self.query_one(RemotePane).load()

    def action_chat(self) -> None:
        """Chat with the local model under the cursor (or the catalog model, once here)."""
        if self._tab() == "catalog-pane":
            row = self.catalog.current_row()
            name = row.local if row is not None else None
        else:
            name = cursor_key(self.query_one("#models-table", DataTable))
        if name:
            self.post_message(self.ModelChosen(name))
        else:
            self.notify("Choose a model that is on this machine first.", timeout=4)

    def action_back(self) -> None:
        if self.focused is self.query_one("#catalog-filter", Input):
            self.query_one("#catalog-table", DataTable).focus()
            return
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()

    def palette_commands(self) -> list[Command]:
        commands: list[Command] = [
            ("Chat with this model", "Open the chat on the selected model", self.action_chat),
            ("Show local models", "The models on this machine", self.action_show_local),
            ("Show remote servers", "The models remote servers serve", self.action_show_remote),
            ("Reload models", "Read the model list again", self.action_reload),
        ]
        if self.actions is not None:
            commands += [
                ("Show catalog", "Curated models to download, with fit", self.action_show_catalog),
                ("Filter catalog", "Type to narrow the catalog", self.action_filter),
                ("Pull model", "Download the selected catalog model", self.action_pull),
                ("Cancel download", "Stop the selected or running pull", self.action_cancel_pull),
                ("Remove model", "Delete the selected local model", self.action_remove),
                (
                    "Clear finished downloads",
                    "Tidy the downloads list",
                    self.action_clear_downloads,
                ),
            ]
        return commands

    # cursor helpers -----------------------------------------------------------------------------
