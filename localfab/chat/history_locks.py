"""The file locks of replies being written (see `history`): a writer holds its reply's lock for
as long as the reply is `generating`; the operating system drops it when the writer exits, so a
free lock on a `generating` reply means it was cut off."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ReplyLocks:
    """The locks this process holds, one per reply it writes, in a folder beside the database.

    The locks come from `filelock` (flock on Unix, LockFileEx on Windows), imported when a reply
    is written or checked, not before.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.held: dict[int, Any] = {}  # message id -> held filelock.FileLock

    def __contains__(self, message_id: object) -> bool:
        return message_id in self.held

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.held))

    def lock_for(self, message_id: int) -> Any:
        """The (not yet taken) file lock of a reply."""
        from filelock import FileLock

        self.folder.mkdir(parents=True, exist_ok=True)
        return FileLock(self.folder / f"{message_id}.lock", thread_local=False)

    def hold(self, message_id: int, timeout: float) -> None:
        """Take the reply's lock (waiting up to `timeout` seconds) and keep it."""
        lock = self.lock_for(message_id)
        lock.acquire(timeout=timeout)
        self.held[message_id] = lock

    def release(self, message_id: int) -> None:
        """Let a held lock go (nothing when it is not held)."""
        lock = self.held.pop(message_id, None)
        if lock is not None:
            drop(lock)

    def cut_off(self, message_id: int) -> Any | None:
        """The reply's lock, taken, when no writer holds it (the reply was cut off); None while
        its writer lives, when this object writes it, or when the folder cannot be written.
        The caller lets it go with `drop`."""
        from filelock import Timeout

        if message_id in self.held:
            return None
        try:
            lock = self.lock_for(message_id)
            lock.acquire(timeout=0)
        except (Timeout, OSError):
            return None
        return lock


def drop(lock: Any) -> None:
    """Release a taken lock and remove its file."""
    lock.release()
    with contextlib.suppress(OSError):
        Path(lock.lock_file).unlink()
