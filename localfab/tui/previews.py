"""Pictures of the images on a message, below its chips, drawn by textual-image with the best
the terminal has: Sixel or kitty's graphics protocol, else coloured half cells (any terminal
with true colour). `image_previews` in config.toml: auto, halfcell or off (the chips alone).

textual-image asks the terminal what it draws and its cell size (escape sequences and their
answers; auto and halfcell both, off not), which works only before the app starts: Textual then
reads every answer itself. `detect` asks once, at start; until then (and in tests that do not
choose) no pictures are drawn, only chips. Pictures are decoded one at a time (a big PNG takes
a few hundred MB while it is), small, off the app's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.containers import Horizontal, Vertical
from textual.widget import Widget

from localfab.tui.image_paths import MAX_IMAGE_BYTES

if TYPE_CHECKING:
    from PIL.Image import Image as Picture

ROWS = 6  # a picture's height in cells; its width follows its shape (a cell is about 1:2)
MAX_COLUMNS = 28
THUMB_PX = 192  # a picture is decoded at about this size (JPEG decodes smaller directly)
MAX_PIXELS = 64_000_000  # a bigger image is not decoded for its picture (the chip stays)
FORMATS = ("PNG", "JPEG", "GIF", "BMP")  # what the chat attaches; nothing else is decoded

# The textual-image widget class that draws (given a picture), or None: no pictures.
_drawer: Callable[..., Widget] | None = None
_decoding = threading.Lock()  # one image decoded at a time, whatever the messages on screen


def detect(mode: str) -> str:
    """Choose how pictures are drawn, asking the terminal where `mode` is auto; call it before
    the app runs. Returns what was chosen: sixel, tgp, halfcell or off."""
    global _drawer
    _drawer = None
    if mode == "off":
        return "off"
    if mode == "auto" and not _on_a_terminal():
        return "off"  # nobody to ask, and nobody to see them
    try:
        if mode == "halfcell":
            from textual_image.widget import HalfcellImage

            _drawer = HalfcellImage
            return "halfcell"
        from textual_image.renderable import Image as Best
        from textual_image.widget import Image as BestWidget
    except Exception:  # a terminal that answers garbage, a missing Pillow: chips alone
        return "off"
    finally:
        _drop_late_answers()
    _drawer = BestWidget
    return Best.__module__.rsplit(".", 1)[-1]  # sixel, tgp, halfcell (or unicode)


def _on_a_terminal() -> bool:
    streams = (sys.__stdin__, sys.__stdout__)
    return all(s is not None and s.isatty() for s in streams)


def _drop_late_answers() -> None:
    """Discard what the terminal sent and nobody read (an answer that came after its wait):
    the app would take it for keys typed."""
    if not _on_a_terminal() or sys.platform == "win32":
        return
    import termios

    with contextlib.suppress(OSError, termios.error):
        termios.tcflush(sys.__stdin__.fileno(), termios.TCIFLUSH)  # type: ignore[union-attr]


def drawing() -> bool:
    """Whether pictures are drawn (else a message shows its chips alone)."""
    return _drawer is not None


def thumbnail(picture: bytes | Path) -> Picture | None:
    """A small copy of an image for its picture; None for one that cannot be read or decoded
    (its chip says what it is all the same)."""
    from PIL import Image

    try:
        data = picture if isinstance(picture, bytes) else _read(picture)
        if data is None:
            return None
        with _decoding, Image.open(io.BytesIO(data), formats=FORMATS) as image:
            width, height = image.size
            if width * height > MAX_PIXELS or width < 1 or height < 1:
                return None
            image.draft("RGB", (THUMB_PX, THUMB_PX))  # JPEG: decoded at 1/2..1/8 scale
            image.thumbnail((THUMB_PX, THUMB_PX))
            return _flat(image)
    except Exception:  # a truncated or corrupt file, a decompression bomb, a file gone
        return None


def _read(path: Path) -> bytes | None:
    """The file's bytes; None for what is no regular file (a pipe would block the reader)."""
    if not path.is_file():
        return None
    with path.open("rb") as fh:
        return fh.read(MAX_IMAGE_BYTES + 1)


def _flat(image: Picture) -> Picture:
    """The image in RGB, transparent parts on mid grey (readable on a dark or a light theme)."""
    from PIL import Image

    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        ground = Image.new("RGBA", rgba.size, (128, 128, 128, 255))
        return Image.alpha_composite(ground, rgba).convert("RGB")
    return image.convert("RGB")


def cells(width: int, height: int) -> tuple[int, int]:
    """The columns and rows a picture of `width`×`height` pixels takes."""
    columns = round(ROWS * 2 * width / max(1, height))
    return max(2, min(MAX_COLUMNS, columns)), ROWS


def rows_of(widths: Sequence[int], room: int, gap: int = 1) -> list[list[int]]:
    """Pictures of `widths` columns in rows of at most `room` columns (a picture wider than
    the room has a row of its own), as lists of indexes."""
    rows: list[list[int]] = []
    used = room + 1  # no row yet
    for i, width in enumerate(widths):
        if used + gap + width > room:
            rows.append([])
            used = -gap
        rows[-1].append(i)
        used += gap + width
    return rows


class ImagePreviews(Vertical):
    """A message's pictures in rows as wide as the message, shown once they are decoded (off
    the app's thread); a narrower message moves the last of a row to the next."""

    DEFAULT_CSS = """
    ImagePreviews {
        height: auto;
        width: 1fr;
        margin: 0 0 1 0;
        display: none;
    }
    ImagePreviews.-shown {
        display: block;
    }
    ImagePreviews > Horizontal {
        height: auto;
    }
    ImagePreviews .picture {
        margin: 0 1 0 0;
    }
    """

    def __init__(self, pictures: Sequence[bytes | Path | None]) -> None:
        super().__init__(classes="previews")
        self._pending = list(pictures)  # dropped once decoded (an image can be 64 MiB)
        self._small: list[Picture] = []
        self._rows: list[list[int]] = []  # as placed
        self._placing = asyncio.Lock()  # a resize while the rows are rebuilt waits for them

    def on_mount(self) -> None:
        self._decode()

    @work(thread=True, group="previews", exit_on_error=False)
    def _decode(self) -> None:
        pending, self._pending = self._pending, []
        small = [thumbnail(p) for p in pending if p is not None]
        self.app.call_from_thread(self._show, [s for s in small if s is not None])

    def _show(self, small: list[Picture]) -> None:
        self._small = small
        self.call_later(self._place)

    async def on_resize(self) -> None:
        await self._place()

    async def _place(self) -> None:
        """Lay the pictures out in rows for the width there is (again only when it changes)."""
        async with self._placing:
            await self._place_rows()

    async def _place_rows(self) -> None:
        if _drawer is None or not self.is_attached or not self._small:
            return
        sizes = [cells(p.width, p.height) for p in self._small]
        rows = rows_of([w for w, _ in sizes], self.size.width or 80)
        if rows == self._rows:
            return
        self._rows = rows
        await self.remove_children()
        placed = []
        for row in rows:
            drawn = [_drawer(self._small[i], classes="picture") for i in row]
            for i, widget in zip(row, drawn, strict=True):
                widget.styles.width, widget.styles.height = sizes[i]
            placed.append(Horizontal(*drawn))
        await self.mount_all(placed)
        self.add_class("-shown")
