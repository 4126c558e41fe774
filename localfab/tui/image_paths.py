"""Images the chat attaches by path: what a typed `/image PATH`, a paste or a dropped file
gives (terminals hand a drop over as a paste of its path: quoted, with backslash-escaped
spaces, or as a file:// URL), read and checked before it goes with a message."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import unquote, urlsplit

from localfab.chat.history_images import Attachment
from localfab.engine.image_header import image_size
from localfab.errors import UsageError
from localfab.units import MiB, format_bytes

SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")
MAX_IMAGE_BYTES = 64 * MiB  # a bigger file is refused before it is read
COMMAND = re.compile(r"^/image(?:\s+(.*))?$", re.DOTALL)


def pasted_path(text: str) -> Path | None:
    """The image file a paste names (a dropped file, a copied path), or None for text."""
    text = text.strip()
    if not text or "\n" in text or len(text) > 4096:
        return None
    if not text.rstrip("'\"").lower().endswith(SUFFIXES):
        return None  # most pastes are text: nothing on disk is looked at for them
    try:
        path = _one_path(text)
        return path if path is not None and path.is_file() else None
    except (OSError, RuntimeError, ValueError):  # a name too long, ~nobody, a NUL byte
        return None


def _one_path(text: str) -> Path | None:
    """The path a text names: as it is, shell-quoted, or a file:// URL (OSError, RuntimeError
    or ValueError for one the system cannot look at)."""
    if text.startswith("file://"):
        return Path(unquote(urlsplit(text).path))
    raw = Path(text).expanduser()
    if raw.exists():  # a path as it is, spaces and all
        return raw
    try:
        parts = shlex.split(text)  # quotes and backslash-escaped spaces, as shells give them
    except ValueError:
        return raw
    return Path(parts[0]).expanduser() if len(parts) == 1 else raw


def command_path(text: str) -> str | None:
    """The path of a `/image PATH` command ("" for `/image` alone), or None for a message."""
    found = COMMAND.match(text.strip())
    if found is None:
        return None
    return (found.group(1) or "").strip()


def read_image(given: str) -> tuple[Attachment, str]:
    """An image file as an attachment and its chip's label; UsageError, in one line, for a
    path that is not there or not an image."""
    try:
        path = _one_path(given.strip()) if given.strip() else None
    except (OSError, RuntimeError, ValueError) as exc:
        raise UsageError(f"cannot read {given.strip()}: {exc}") from exc
    if path is None:
        raise UsageError("give the image's path: /image PATH")
    try:
        if not path.is_file():  # a folder, a device, a pipe: nothing to read whole
            raise UsageError(f"cannot read {path}: not a file")
        with path.open("rb") as fh:
            data = fh.read(MAX_IMAGE_BYTES + 1)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if len(data) > MAX_IMAGE_BYTES:
        raise UsageError(f"{path.name} is more than {format_bytes(MAX_IMAGE_BYTES)}")
    try:
        fmt, width, height = image_size(data)
    except Exception as exc:
        raise UsageError(f"{path.name}: {exc}") from exc
    del fmt
    return Attachment(data, path.name), f"{path.name} · {width}×{height}"
