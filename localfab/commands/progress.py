"""Download progress for `localfab pull`, on stderr: a `rich` bar on a terminal, plain lines
elsewhere (logs, pipes)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from localfab.units import format_duration, human_size

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from localfab.hub import DownloadProgress


class ProgressLine:
    """Download progress on stderr: bytes, percent, speed, ETA.

    On a terminal a `rich` progress bar redraws in place; otherwise (logs, pipes) a line is
    printed when a file starts and when a stage ends, so logs stay short and parseable.
    """

    def __init__(self, *, enabled: bool = True, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.key: tuple[int, str] | None = None
        self.last: DownloadProgress | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, p: DownloadProgress) -> None:
        if not self.enabled:
            return
        key = (p.file_index, p.stage)
        if key != self.key:
            self._end_line()
            self.key = key
            self._print(self.headline(p))
            if p.stage == "wait":
                return
            if self.tty:
                self._start_bar()
        self.last = p
        if self._bar is not None and self._task is not None:
            self._bar.update(
                self._task, completed=p.done, total=p.total, info=self.render(p, bar=True)
            )
            self._bar.refresh()

    @staticmethod
    def headline(p: DownloadProgress) -> str:
        """The line that starts a file's stage: what is downloaded, waited for or verified."""
        part = f" (part {p.file_index + 1} of {p.file_count})" if p.file_count > 1 else ""
        if p.stage == "wait":
            return f"another localfab is downloading {p.file}{part}: waiting for it"
        if p.stage == "verify":
            return f"verifying sha256 of {p.file}{part}"
        resumed = f", resuming at {human_size(p.done)}" if p.done and p.resumed else ""
        return f"downloading {p.file}{part}, {human_size(p.total)}{resumed}"

    @staticmethod
    def render(p: DownloadProgress, *, bar: bool = False) -> str:
        """`  812.0 MiB / 4.36 GiB   18.2%  21.3 MiB/s  ETA 2m52s` (the bar shows the rest)."""
        pct = f"{100 * p.done / p.total:5.1f}%" if p.total else "   ?%"
        amount = f"{human_size(p.done)} / {human_size(p.total)}  {pct}"
        if p.stage == "verify":
            return "hashing" if bar else f"  {amount}  hashing"
        speed = f"{human_size(int(p.speed))}/s" if p.speed else "--/s"
        rate = f"{speed}  ETA {format_duration(p.eta)}"
        return rate if bar else f"  {amount}  {rate}"

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
        )

        console = Console(file=self.stream, force_terminal=True, highlight=False)
        self._bar = Progress(
            TextColumn(" "),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TaskProgressColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            auto_refresh=False,  # redrawn on each (throttled) report: no refresh thread
        )
        self._task = self._bar.add_task("", total=None, info="")
        self._bar.start()

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _end_line(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._task = None
        elif self.last is not None:
            self._print(self.render(self.last))
        self.last = None

    def close(self) -> None:
        if self.enabled:
            self._end_line()
