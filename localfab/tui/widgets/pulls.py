"""The downloads panel: one line per pull with a progress bar, bytes, speed and time left."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Label, ProgressBar, Static

from localfab.tui.downloads import PullJob, describe


class PullItem(Vertical):
    """One download: its name, a bar, a Cancel button, and a line that says where it stands."""

    DEFAULT_CSS = """
    PullItem {
        height: auto;
    }
    PullItem > Horizontal {
        height: 1;
    }
    PullItem .pull-name {
        width: 24;
        text-style: bold;
    }
    PullItem ProgressBar {
        width: 1fr;
    }
    PullItem Bar {
        width: 1fr;
    }
    PullItem Button {
        min-width: 10;
    }
    PullItem .pull-info {
        color: $text-muted;
        padding: 0 0 0 2;
    }
    PullItem.-failed .pull-info {
        color: $text-error;
    }
    PullItem.-done .pull-info {
        color: $text-success;
    }
    """

    def __init__(self, job: PullJob) -> None:
        super().__init__(id=f"pull-{job.id}")
        self.job = job

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Label(self.job.name, classes="pull-name", markup=False)
            yield ProgressBar(show_eta=False)
            yield Button("Cancel", compact=True, classes="pull-cancel")
        yield Static("", classes="pull-info", markup=False)

    def on_mount(self) -> None:
        self.show(self.job)

    def show(self, job: PullJob) -> None:
        """Redraw for the job's latest state (kept for `on_mount` until the line is composed)."""
        self.job = job
        bars = self.query(ProgressBar)
        if not bars:
            return
        bar = bars.first()
        p = job.progress
        if job.state == "done":
            bar.update(total=1, progress=1)
        elif p is not None and p.total:
            bar.update(total=p.total, progress=min(p.done, p.total))
        elif job.state == "running":
            bar.update(total=None)  # size not known yet: the bar pulses
        else:
            bar.update(total=1, progress=0)  # queued (or ended early): an empty bar
        self.query_one(".pull-info", Static).update(describe(job))
        self.query_one(Button).display = not job.finished
        for state in ("queued", "running", "done", "failed", "cancelled"):
            self.set_class(job.state == state, f"-{state}")


class PullsPanel(VerticalScroll):
    """Every download of this run of the app; hidden while there are none."""

    DEFAULT_CSS = """
    PullsPanel {
        height: auto;
        max-height: 9;
        border-top: solid $primary;
        padding: 0 1;
        display: none;
    }
    PullsPanel.-busy {
        display: block;
    }
    PullsPanel > .pulls-title {
        color: $primary;
        text-style: bold;
    }
    """

    @dataclass
    class CancelPressed(Message):
        """The user asked to cancel the pull of `name`."""

        name: str

    def compose(self) -> ComposeResult:
        yield Label("Downloads", classes="pulls-title", markup=False)

    def show(self, job: PullJob) -> None:
        """Add or redraw the job's line."""
        found = self.query(f"#pull-{job.id}")
        if found:
            item = found.first(PullItem)
            item.show(job)
        else:
            self.mount(PullItem(job))
        self.add_class("-busy")

    def clear_finished(self) -> None:
        for item in list(self.query(PullItem)):
            if item.job.finished:
                item.remove()
        if not any(not i.job.finished for i in self.query(PullItem)):
            self.remove_class("-busy")

    @on(Button.Pressed, ".pull-cancel")
    def _cancel(self, event: Button.Pressed) -> None:
        event.stop()
        item = next(a for a in event.button.ancestors if isinstance(a, PullItem))
        self.post_message(self.CancelPressed(item.job.name))
