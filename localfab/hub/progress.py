"""Download progress: what a pull reports while it waits, downloads and verifies."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Stage = Literal["wait", "download", "verify"]


@dataclass(frozen=True)
class DownloadProgress:
    """One progress report: bytes on disk of the whole model, speed of this run, time left.

    `stage` is "wait" while another process downloads the same file, "download" while bytes
    arrive and "verify" while the sha256 is computed (then `done`/`total` count bytes hashed).
    """

    file: str
    file_index: int
    file_count: int
    done: int
    total: int | None
    speed: float
    eta: float | None
    resumed: int
    stage: Stage = "download"


ProgressCallback = Callable[[DownloadProgress], None]


class TrackedFile(Protocol):
    """What the tracker reads of one file (live: `resume` changes once the partial is opened)."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int | None: ...

    @property
    def resume(self) -> int: ...


class Tracker:
    """Aggregates bytes across a model's files into `DownloadProgress` reports (throttled)."""

    def __init__(self, callback: ProgressCallback | None, files: Sequence[TrackedFile]) -> None:
        self.callback = callback
        self.files = files
        total = 0
        for f in files:
            total += f.size or 0
        self.total: int | None = None if any(f.size is None for f in files) else total
        self.index = 0
        self.file_done = 0
        self.completed = 0  # bytes of files already finished
        self.samples: deque[tuple[float, int]] = deque()
        self.session = 0  # bytes received in this run (for the speed)
        self.last_emit = 0.0

    @property
    def resumed(self) -> int:
        """Bytes this run did not have to fetch again (kept from an earlier, interrupted run)."""
        return sum(f.resume for f in self.files)

    def start(self, index: int) -> None:
        self.index = index
        self.file_done = 0

    def set_file_done(self, n: int) -> None:
        self.file_done = n
        self.emit(force=True)

    def finish_file(self, index: int) -> None:
        size = self.files[index].size
        self.completed += size if size is not None else self.file_done
        self.file_done = 0

    def advance(self, n: int) -> None:
        self.file_done += n
        self.session += n
        now = time.monotonic()
        self.samples.append((now, self.session))
        while len(self.samples) > 2 and now - self.samples[0][0] > 5.0:
            self.samples.popleft()
        self.emit()

    def speed(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def emit(
        self, *, force: bool = False, stage: Stage = "download", done: int | None = None
    ) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if not force and now - self.last_emit < 0.2:
            return
        self.last_emit = now
        speed = self.speed() if stage == "download" else 0.0
        done_all = self.completed + self.file_done if done is None else done
        item = self.files[min(self.index, len(self.files) - 1)]
        total = self.total if stage == "download" else item.size
        eta = (total - done_all) / speed if total is not None and speed > 0 else None
        self.callback(
            DownloadProgress(
                file=item.name,
                file_index=self.index,
                file_count=len(self.files),
                done=done_all,
                total=total,
                speed=speed,
                eta=eta,
                resumed=self.resumed,
                stage=stage,
            )
        )
