"""Images in the chat app (pilot, on the fake engine with a stand-in projector): attached by
`/image PATH` or a pasted (dropped) path, shown as chips above the prompt and on the message
(with their pictures: tests/tui/test_previews.py), sent with it, stored with the chat and back
when it is reopened; what cannot be attached says why. Snapshots at 100x30 and 80x24, dark and
light, pictures drawn in half cells."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from textual import events
from textual.widgets import Static

from localfab.chat.history import History
from localfab.chat.history_images import Attachment, refs_from
from localfab.tui.image_paths import command_path, pasted_path
from localfab.tui.widgets.prompt import PromptBox
from localfab.tui.widgets.versions import ChatMessage
from tests.engine.test_vision import BLUE, NOISE, png
from tests.fake_engine import FakeEngine, FakeProjector
from tests.tui.test_snapshots import SIZES, THEMES, dated, snap_chat
from tests.tui_support import FIXED_NOW, build_app, finished, loaded, send, wait_for


def _sunset() -> bytes:
    """An 80×48 picture that reads as one at a glance: orange to purple, a yellow sun."""
    y, x = np.mgrid[0:48, 0:80]
    top, bottom = np.array([255, 150, 40]), np.array([70, 20, 110])
    sky = top + (bottom - top) * (y / 47)[..., None]
    sun = (x - 40) ** 2 + (y - 30) ** 2 < 100
    sky[sun] = (255, 230, 90)
    return png(80, 48, sky)


SUNSET = _sunset()


@pytest.fixture
def pictures(tmp_path: Path) -> Path:
    folder = tmp_path / "My Pictures"
    folder.mkdir()
    (folder / "noise.png").write_bytes(NOISE)
    (folder / "blue.png").write_bytes(BLUE)
    (folder / "notes.png").write_text("not an image at all")
    return folder


async def command(pilot, app, text: str) -> None:  # type: ignore[no-untyped-def]
    """Type a command (`/image PATH`) in the prompt box and press Enter."""
    box = app.chat.query_one(PromptBox)
    box.focus()
    box.insert(text)
    await pilot.press("enter")
    await pilot.pause()


def bar(app: object) -> Static:
    return app.chat.query_one("#attachments", Static)  # type: ignore[attr-defined]


def test_paths_as_terminals_paste_them(pictures: Path) -> None:
    image = pictures / "noise.png"
    for given in (str(image), f"'{image}'", str(image).replace(" ", "\\ "), image.as_uri()):
        assert pasted_path(given) == image, given
    assert pasted_path("look at noise.png and tell me") is None  # text, not a path
    assert pasted_path(str(pictures / "missing.png")) is None
    assert pasted_path(f"{image}\n{image}") is None
    # Text the system cannot look at as a path is text, not an error.
    assert pasted_path("x" * 300 + ".png") is None and pasted_path("~nobody-here/a.png") is None
    assert pasted_path("a\x00b.png") is None
    assert command_path("/image ~/a b.png") == "~/a b.png" and command_path("/image") == ""
    assert command_path("/images are nice") is None and command_path("hello") is None


@pytest.mark.anyio
async def test_an_image_goes_with_the_message_and_comes_back_with_the_chat(
    tmp_path: Path, pictures: Path
) -> None:
    history = History(tmp_path / "sessions.sqlite3")
    engine = FakeEngine(projector=FakeProjector())
    app, _ = build_app(history, engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await command(pilot, app, f"/image {pictures / 'noise.png'}")
        await wait_for(pilot, lambda: bar(app).has_class("shown"))
        assert "▣ noise.png · 80×48" in str(bar(app).render())
        box = app.chat.query_one(PromptBox)
        assert box.text == ""  # the command was not sent
        box.post_message(events.Paste(str(pictures / "blue.png")))  # a dropped file
        await wait_for(pilot, lambda: len(app.chat.attached) == 2)
        assert box.text == ""
        await send(pilot, app, "What is in them?")
        await finished(pilot, app)
        assert engine.projector is not None and engine.projector.images == [NOISE, BLUE]
        assert not bar(app).has_class("shown") and app.chat.attached == []
        mine = [v for v in app.chat.query(ChatMessage) if v.role == "user"][-1]
        assert [i.label for i in mine.images] == ["noise.png · 80×48", "blue.png · 80×48"]
        sid = app.chat.backend.session_id  # type: ignore[union-attr]
    (user, _) = history.messages(sid)
    assert [r.name for r in refs_from(user.images)] == ["noise.png", "blue.png"]

    again, engine2 = build_app(
        history, engine=FakeEngine(projector=FakeProjector()), session_id=sid
    )
    async with again.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, again)
        shown = [v for v in again.chat.query(ChatMessage) if v.role == "user"]
        assert [i.label for i in shown[0].images] == ["noise.png · 80×48", "blue.png · 80×48"]
        assert engine2.projector is not None and engine2.projector.images == [NOISE, BLUE]
    history.close()


@pytest.mark.anyio
async def test_what_cannot_be_attached_says_why(tmp_path: Path, pictures: Path) -> None:
    history = History(tmp_path / "sessions.sqlite3")
    app, _ = build_app(history, engine=FakeEngine(projector=FakeProjector()))
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        for given, says in (
            (pictures / "notes.png", "notes.png: not an image"),
            (pictures / "gone.png", "cannot read"),
        ):
            await command(pilot, app, f"/image {given}")
            await wait_for(
                pilot, lambda s=says: any(s in str(n.message) for n in app._notifications)
            )
        assert app.chat.attached == []
        await command(pilot, app, f"/image {pictures / 'noise.png'}")
        await wait_for(pilot, lambda: len(app.chat.attached) == 1)
        await pilot.press("backspace")  # in the empty prompt: takes it off
        await wait_for(pilot, lambda: app.chat.attached == [])
        assert not bar(app).has_class("shown")
    text_only, _ = build_app(history)  # no projector
    async with text_only.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, text_only)
        await command(pilot, text_only, f"/image {pictures / 'noise.png'}")
        await wait_for(
            pilot,
            lambda: any("reads no images" in str(n.message) for n in text_only._notifications),
        )
        assert text_only.chat.attached == []
    history.close()


def image_chat(path: Path, pictures: Path) -> tuple[History, int]:
    """A stored chat whose first message carried two images."""
    history = History(path)
    sid = history.create_session(model="fake-model")
    refs = [
        history.images.put(Attachment(SUNSET, "sunset.png")),
        history.images.put(Attachment(BLUE, "blue.png")),
    ]
    history.add_message(
        sid, "user", "What is in these pictures?", images=json.dumps([vars(r) for r in refs])
    )
    history.add_message(sid, "assistant", "A sunset over the sea, and a blue square.")
    dated(history, sid, FIXED_NOW - 300, FIXED_NOW - 60)
    return history, sid


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chat_with_images(snap_compare, tmp_path, size, theme, halfcell):
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    (pictures / "diagram.png").write_bytes(NOISE)
    history, sid = image_chat(tmp_path / "sessions.sqlite3", pictures)

    async def attach(app, pilot) -> None:
        app.chat.backend._loaded.engine.projector = FakeProjector()
        app.chat.attach(str(pictures / "diagram.png"))
        await wait_for(pilot, lambda: bool(app.chat.attached))
        # The stored message's two pictures, decoded off the app's thread.
        await wait_for(pilot, lambda: len(app.chat.query(".picture")) == 2)
        await pilot.pause()

    assert snap_chat(snap_compare, history, sid, size, theme, then=attach)
