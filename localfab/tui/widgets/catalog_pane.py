"""The models screen's catalog: curated models to download, filtered as the user types, each
with its fit on this machine (judged from its GGUF header on the hub) and its download status.

Its rows, fits and errors are its own; the screen asks it for the row under the cursor, tells
it when a download changed, and handles Enter on a row (chat with it, or pull it).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static
from textual.worker import get_current_worker

from localfab.errors import LocalfabError
from localfab.tui.downloads import PullJob
from localfab.tui.models import ESTIMATE, CatalogRow, ModelActions
from localfab.tui.plain import plain_cell
from localfab.units import format_bytes

CATALOG_COLUMNS = ("Name", "Size", "Params", "Context", "Fit", "Status")
# Columns whose cells change after the row is drawn keep one width ("20/29 GPU 32k",
# "10.0 MiB kept"), so the table does not jump as verdicts and progress arrive.
WIDTHS = {"Fit": 13, "Status": 13}
CHECKING = "checking…"
UNCHECKED = "can't check"
# Header reads on the hub at once while judging the catalog's fit.
FIT_THREADS = 4


def cursor_key(table: DataTable[object]) -> str | None:
    """The key of the row under the table's cursor (None when it is empty)."""
    if not table.row_count:
        return None
    key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
    return None if key is None else str(key)


def restore_cursor(table: DataTable[object], key: str | None) -> None:
    """Put the cursor back on the row `key` after the table was filled again."""
    if key is None:
        return
    try:
        table.move_cursor(row=table.get_row_index(key), animate=False)
    except Exception:  # noqa: BLE001 - the row went away: the cursor stays where it is
        return


class CatalogPane(Vertical):
    """The filter, the catalog table and the selected model's detail line."""

    @dataclass
    class Loaded(Message):
        rows: list[CatalogRow]
        error: str = ""

    @dataclass
    class FitJudged(Message):
        name: str
        verdict: str
        error: str = ""

    def __init__(self, actions: ModelActions | None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.actions = actions
        self.catalog_rows: list[CatalogRow] = []
        self.catalog_fits: dict[str, str] = {}
        self.catalog_errors: dict[str, str] = {}
        self.fits_started = False

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="Filter: name, family, size or use (/)",
            id="catalog-filter",
            compact=True,
        )
        yield DataTable(id="catalog-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="catalog-detail", markup=False)

    def on_mount(self) -> None:
        table = self.query_one("#catalog-table", DataTable)
        for column in CATALOG_COLUMNS:
            table.add_column(plain_cell(column), key=column.lower(), width=WIDTHS.get(column))

    # loading and fits ---------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="catalog", exit_on_error=False)
    def load(self) -> None:
        """Read the catalog (in a worker)."""
        assert self.actions is not None
        try:
            rows = self.actions.catalog()
        except LocalfabError as exc:
            self.post_message(self.Loaded([], str(exc)))
            return
        self.post_message(self.Loaded(rows))

    @on(Loaded)
    def _loaded(self, event: Loaded) -> None:
        # Not stopped: the screen starts the fit checks when the catalog's tab is showing.
        self.catalog_rows = event.rows
        if event.error:
            self._detail(event.error, error=True)
        self.fill()

    def visible_rows(self) -> list[CatalogRow]:
        text = self.query_one("#catalog-filter", Input).value
        return [r for r in self.catalog_rows if r.matches(text)]

    def fill(self) -> None:
        """Fill the table again (the filter, fits or statuses changed); the cursor stays."""
        table = self.query_one("#catalog-table", DataTable)
        keep = cursor_key(table)
        table.clear()
        for row in self.visible_rows():
            fit = self.catalog_fits.get(row.name, CHECKING if self.fits_started else "")
            cells = (row.name, row.size, row.params, row.context, fit, self.status(row))
            table.add_row(*(plain_cell(c) for c in cells), key=row.name)
        restore_cursor(table, keep)
        self.show_detail()

    def start_fit_checks(self) -> None:
        """Judge every model's fit, once (when the catalog is first shown)."""
        if self.fits_started or self.actions is None or not self.catalog_rows:
            return
        self.fits_started = True
        self.fill()
        self.check_fits(list(self.catalog_rows))

    def recheck(self) -> None:
        """Judge again the fits that could not be checked or were only estimated."""
        if self.actions is None or not self.fits_started:
            return
        retry = [
            r
            for r in self.catalog_rows
            if r.name in self.catalog_errors
            or self.catalog_fits.get(r.name, "").startswith(ESTIMATE)
        ]
        for row in retry:
            self.set_cell(row.name, "fit", CHECKING)
        if retry:
            self.check_fits(retry)

    @work(thread=True, group="catalog-fit", exit_on_error=False)
    def check_fits(self, rows: list[CatalogRow]) -> None:
        """Judge each catalog model's fit from its header on the hub; errors stay per row."""
        assert self.actions is not None
        actions = self.actions
        worker = get_current_worker()

        def judge(row: CatalogRow) -> None:
            if worker.is_cancelled:
                return
            try:
                verdict, error = actions.remote_fit(row), ""
            except LocalfabError as exc:
                verdict, error = UNCHECKED, str(exc)
            except Exception as exc:  # noqa: BLE001 - one row's failure never breaks the list
                verdict, error = UNCHECKED, f"{type(exc).__name__}: {exc}"
            self.post_message(self.FitJudged(row.name, verdict, error))

        with ThreadPoolExecutor(max_workers=FIT_THREADS) as pool:
            list(pool.map(judge, rows))

    @on(FitJudged)
    def _fit_judged(self, event: FitJudged) -> None:
        event.stop()
        self.catalog_fits[event.name] = event.verdict
        if event.error:
            self.catalog_errors[event.name] = event.error
        else:
            self.catalog_errors.pop(event.name, None)
        self.set_cell(event.name, "fit", event.verdict)
        if self.current_key() == event.name:
            self.show_detail()

    def set_cell(self, name: str, column: str, value: str) -> None:
        table = self.query_one("#catalog-table", DataTable)
        if name in {str(k.value) for k in table.rows}:
            table.update_cell(name, column, plain_cell(value))

    # the filter and the cursor ------------------------------------------------------------------
    @on(Input.Changed, "#catalog-filter")
    def _filtered(self) -> None:
        self.fill()

    @on(Input.Submitted, "#catalog-filter")
    def _filter_done(self) -> None:
        self.query_one("#catalog-table", DataTable).focus()

    @on(DataTable.RowHighlighted, "#catalog-table")
    def _highlighted(self) -> None:
        self.show_detail()

    def current_key(self) -> str | None:
        return cursor_key(self.query_one("#catalog-table", DataTable))

    def current_row(self) -> CatalogRow | None:
        key = self.current_key()
        return next((r for r in self.catalog_rows if r.name == key), None)

    # the detail line and the download status ----------------------------------------------------
    def show_detail(self) -> None:
        row = self.current_row()
        if row is None:
            if not self.catalog_rows:
                return
            self._detail("No catalog model matches the filter.")
            return
        error = self.catalog_errors.get(row.name)
        if error:
            self._detail(f"{row.name}: {error}", error=True)
            return
        job = self.latest_job(row.name)
        if job is not None and job.state == "failed":
            self._detail(f"{row.name}: {job.message}", error=True)
            return
        here = f" · here as {row.local} (Enter chats)" if row.local else " · Enter downloads it"
        text = f"{row.title} · {row.repo} · {row.license}{here}\n{row.note}"
        if self.catalog_fits.get(row.name, "").startswith(ESTIMATE):
            text += (
                f"\n{ESTIMATE} the hub cannot be reached: the fit is estimated from the catalog's "
                "facts of this model; Ctrl+R checks the file's own header once connected"
            )
        self._detail(text)

    def _detail(self, text: str, *, error: bool = False) -> None:
        detail = self.query_one("#catalog-detail", Static)
        detail.update(text)
        detail.set_class(error, "-error")

    def latest_job(self, name: str) -> PullJob | None:
        if self.actions is None:
            return None
        jobs = [j for j in self.actions.downloads.jobs() if j.name == name]
        return jobs[-1] if jobs else None

    def status(self, row: CatalogRow) -> str:
        job = self.latest_job(row.name)
        if job is not None and job.state == "queued":
            return "queued"
        if job is not None and job.state == "running":
            p = job.progress
            return f"{100 * p.done / p.total:.0f}%" if p and p.total else "starting"
        if row.local:
            return "here"
        if job is not None and job.state in ("failed", "cancelled"):
            return job.state
        if row.kept:
            return f"{format_bytes(row.kept, precise=True)} kept"
        return ""

    def pull_changed(self, job: PullJob) -> None:
        """A download changed: its row's status (and detail) follow."""
        row = next((r for r in self.catalog_rows if r.name == job.name), None)
        if row is not None:
            self.set_cell(row.name, "status", self.status(row))
            if self.current_key() == row.name:
                self.show_detail()
