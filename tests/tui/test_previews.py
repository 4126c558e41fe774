"""Pictures of a message's images in the app (textual-image): decoded small off the app's thread,
bounded before decoding, drawn below the chips where the terminal draws pictures, and never in
the way (a file gone, a corrupt one, previews off: the chips alone)."""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from localfab.chat.history import History
from localfab.chat.history_images import Attachment
from localfab.tui import previews
from localfab.tui.previews import ImagePreviews, cells, detect, rows_of, thumbnail
from localfab.tui.widgets.versions import ChatMessage
from tests.engine.test_vision import BLUE, NOISE
from tests.fake_engine import FakeEngine, FakeProjector
from tests.tui.test_images import command
from tests.tui_support import build_app, finished, loaded, send, wait_for


def grey_png(width: int, height: int) -> bytes:
    """A whole grey PNG of `width`×`height`, small on disk (its rows compress to nothing),
    width×height×3 bytes once decoded."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    packer = zlib.compressobj(9)
    row = b"\x00" + b"\x80" * (3 * width)
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def test_a_picture_is_decoded_small_and_in_rgb(tmp_path: Path) -> None:
    small = thumbnail(NOISE)
    assert small is not None and small.size == (80, 48) and small.mode == "RGB"
    big = io.BytesIO()
    Image.new("RGB", (1200, 900), (200, 30, 30)).save(big, "JPEG")
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(big.getvalue())
    shrunk = thumbnail(photo)  # from the stored file
    assert shrunk is not None and max(shrunk.size) <= previews.THUMB_PX
    assert shrunk.getpixel((5, 5))[0] > 150  # still red
    clear = io.BytesIO()
    Image.new("RGBA", (10, 10), (255, 255, 255, 0)).save(clear, "PNG")
    flat = thumbnail(clear.getvalue())
    assert flat is not None and flat.getpixel((0, 0)) == (128, 128, 128)  # on mid grey


def test_what_cannot_be_decoded_has_no_picture(tmp_path: Path) -> None:
    assert thumbnail(b"not an image") is None
    assert thumbnail(NOISE[: len(NOISE) // 2]) is None  # cut short
    # 72 megapixels (a 216 MB decode, under Pillow's own bomb limit): refused before decoding.
    bomb = grey_png(9000, 8000)
    assert len(bomb) < previews.MAX_IMAGE_BYTES and thumbnail(bomb) is None
    assert thumbnail(grey_png(900, 800)) is not None  # the same, smaller: decoded
    assert thumbnail(tmp_path / "gone.png") is None
    os.mkfifo(tmp_path / "pipe.png")
    assert thumbnail(tmp_path / "pipe.png") is None  # not read: a pipe would block
    tiff = io.BytesIO()
    Image.new("RGB", (4, 4)).save(tiff, "TIFF")
    assert thumbnail(tiff.getvalue()) is None  # only what the chat attaches is decoded


def test_a_picture_keeps_its_shape_within_bounds() -> None:
    assert cells(80, 48) == (20, previews.ROWS)  # a cell is about twice as tall as wide
    assert cells(100, 100) == (12, previews.ROWS)
    assert cells(4000, 100) == (previews.MAX_COLUMNS, previews.ROWS)
    assert cells(1, 4000) == (2, previews.ROWS)


def test_pictures_go_in_rows_as_wide_as_the_message() -> None:
    assert rows_of([18, 20], 47) == [[0, 1]]
    assert rows_of([18, 20, 12], 47) == [[0, 1], [2]]
    assert rows_of([18, 20, 12], 30) == [[0], [1], [2]]
    assert rows_of([28], 10) == [[0]]  # too wide for any row: a row of its own
    assert rows_of([], 40) == []


def test_pictures_are_chosen_before_the_app_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(previews, "_on_a_terminal", lambda: False)
    try:
        assert detect("off") == "off" and not previews.drawing()
        # Not on a terminal: nobody to ask what it draws, nobody to look.
        assert detect("auto") == "off" and not previews.drawing()
        assert detect("halfcell") == "halfcell" and previews.drawing()
    finally:
        detect("off")


def pictures_of(view: ChatMessage) -> list[object]:
    return list(view.query(".picture"))


@pytest.mark.anyio
async def test_a_message_shows_its_pictures(tmp_path: Path, halfcell: None) -> None:
    folder = tmp_path / "pictures"
    folder.mkdir()
    (folder / "noise.png").write_bytes(NOISE)
    (folder / "blue.png").write_bytes(BLUE)
    history = History(tmp_path / "sessions.sqlite3")
    app, _ = build_app(history, engine=FakeEngine(projector=FakeProjector()))
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        for name in ("noise.png", "blue.png"):
            await command(pilot, app, f"/image {folder / name}")
        await wait_for(pilot, lambda: len(app.chat.attached) == 2)
        await send(pilot, app, "What is in them?")
        await finished(pilot, app)
        mine = [v for v in app.chat.query(ChatMessage) if v.role == "user"][-1]
        await wait_for(pilot, lambda: len(pictures_of(mine)) == 2)
        drawn = pictures_of(mine)
        assert [type(p).__name__ for p in drawn] == ["HalfcellImage", "HalfcellImage"]
        assert drawn[0].region.height == previews.ROWS  # type: ignore[attr-defined]
        row = mine.query_one(ImagePreviews)
        assert len(row.children) == 1  # side by side in a 100-column terminal
        await pilot.resize_terminal(44, 30)  # the message is then narrower than both
        await wait_for(pilot, lambda: len(row.children) == 2)
        assert len(pictures_of(mine)) == 2
        sid = app.chat.backend.session_id  # type: ignore[union-attr]
    history.close()
    # Reopened: drawn from the stored files; one gone leaves its chip, without a picture.
    history = History(tmp_path / "sessions.sqlite3")
    (user, _) = history.messages(sid)
    blue = next(r for r in json.loads(user.images) if r["name"] == "blue.png")
    (history.images.folder / blue["sha256"]).unlink()
    again, _ = build_app(history, engine=FakeEngine(projector=FakeProjector()), session_id=sid)
    async with again.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, again)
        shown = [v for v in again.chat.query(ChatMessage) if v.role == "user"][0]
        await wait_for(pilot, lambda: len(pictures_of(shown)) == 1)
        await pilot.pause(0.2)
        assert len(pictures_of(shown)) == 1
        assert [i.label for i in shown.images] == ["noise.png · 80×48", "blue.png · 80×48"]
    history.close()


@pytest.mark.anyio
async def test_with_previews_off_a_message_shows_its_chips_alone(tmp_path: Path) -> None:
    detect("off")
    history = History(tmp_path / "sessions.sqlite3")
    sid = history.create_session(model="fake-model")
    ref = history.images.put(Attachment(NOISE, "noise.png"))
    history.add_message(sid, "user", "Look", images=json.dumps([vars(ref)]))
    app, _ = build_app(history, engine=FakeEngine(projector=FakeProjector()), session_id=sid)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        shown = [v for v in app.chat.query(ChatMessage) if v.role == "user"][0]
        assert not shown.query(ImagePreviews)
        assert "▣ noise.png · 80×48" in str(shown.query_one(".images").render())
    history.close()
