"""The images of stored chats: files named by their content's hash, in a folder beside the
database, and what a message says of its images (JSON in its `images` column).

The same image in several messages or chats is one file. A file stays while a message names
it; `ImageStore.prune`, when the history is opened, removes the others once they are an hour
old (a deleted chat's images may still come back with an undo meanwhile, and another process
may be between storing an image and writing its message).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from localfab.engine.image_header import image_size
from localfab.errors import UsageError

# A file no message names is left this long after it was last written or stored again: another
# process sharing the history may be between storing it and writing its message, or about to
# undo the deletion of its chat (a write cut short leaves a temporary file: also this long).
GRACE_S = 3600.0


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return False


@dataclass(frozen=True)
class Attachment:
    """An image given with a message: its bytes and the name it is shown by."""

    data: bytes
    name: str = "image"


@dataclass(frozen=True)
class ImageRef:
    """A stored image as a message names it."""

    sha256: str
    name: str
    format: str  # PNG, JPEG, GIF or BMP
    width: int
    height: int
    size: int  # bytes

    def label(self) -> str:
        """How a chat shows it: its name and size in pixels."""
        return f"{self.name} · {self.width}×{self.height}"


def attachments(images: Iterable[bytes | Attachment]) -> list[Attachment]:
    """Images as attachments (bare bytes are named "image N")."""
    return [
        img if isinstance(img, Attachment) else Attachment(img, f"image {i + 1}")
        for i, img in enumerate(images)
    ]


def refs_json(refs: Sequence[ImageRef]) -> str:
    return json.dumps([asdict(r) for r in refs]) if refs else ""


def refs_from(text: str) -> list[ImageRef]:
    """A message's images from its column ("" or malformed: none)."""
    if not text:
        return []
    try:
        items = json.loads(text)
        return [ImageRef(**item) for item in items]
    except (ValueError, TypeError):
        return []


def named_images(db: sqlite3.Connection) -> set[str]:
    """The hashes of the images the stored messages name."""
    rows = db.execute("SELECT images FROM messages WHERE images != ''").fetchall()
    return {ref.sha256 for (text,) in rows for ref in refs_from(text)}


class ImageStore:
    """Image files named by their SHA-256, in `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _file(self, sha256: str) -> Path:
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            raise UsageError(f"{sha256!r} is not an image's name in the chat history")
        return self.folder / sha256

    def put(self, image: Attachment) -> ImageRef:
        """Store an image (once, whatever it is called); UsageError for what is no image."""
        try:
            fmt, width, height = image_size(image.data)
        except Exception as exc:
            raise UsageError(f"{image.name}: {exc}") from exc
        sha = hashlib.sha256(image.data).hexdigest()
        path = self._file(sha)
        if path.exists():
            with contextlib.suppress(OSError):
                os.utime(path)  # just used again: a prune elsewhere leaves it its grace
        else:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".incoming-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(image.data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)  # whole or not at all, also on a full disk
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        name = Path(image.name).name or "image"
        return ImageRef(sha, name, fmt, width, height, len(image.data))

    def path(self, ref: ImageRef) -> Path | None:
        """The file that holds the image (it may be gone); None for a name that is no hash."""
        try:
            return self._file(ref.sha256)
        except UsageError:
            return None

    def get(self, ref: ImageRef) -> bytes | None:
        """The image's bytes; None where its file is gone or no longer matches its hash."""
        try:
            data = self._file(ref.sha256).read_bytes()
        except (OSError, UsageError):
            return None
        return data if hashlib.sha256(data).hexdigest() == ref.sha256 else None

    def prune(self, named: set[str]) -> int:
        """Remove the files no message names (and writes cut short); returns how many."""
        removed = 0
        try:
            entries = list(self.folder.iterdir())
        except OSError:
            return 0
        for path in entries:
            if path.name in named:
                continue
            if not _older_than(path, GRACE_S):
                continue  # another process may be writing it, or about to name it
            if len(path.name) == 64 or path.name.startswith(".incoming-"):
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed += 1
        return removed
