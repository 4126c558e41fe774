"""A chat's images in the history: stored once by their hash beside the database, back in the
prompt when the chat is resumed (not encoded again while the projector keeps them), kept by an
edit, exported and imported with the chat, and removed once no chat names them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localfab.chat.history import History
from localfab.chat.history_images import Attachment, ImageStore, refs_from
from localfab.chat.transfer import export_json, export_markdown, import_json
from localfab.errors import UsageError
from tests.engine.test_vision import BLUE, MMPROJ, NOISE


def age(folder: Path) -> None:
    """Every file in `folder` as if last written two hours ago."""
    import os
    import time

    for path in folder.iterdir():
        old = time.time() - 7200
        os.utime(path, (old, old))


def test_an_image_is_stored_once_by_its_hash_and_checked(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    first = store.put(Attachment(NOISE, "/home/me/noise.png"))
    again = store.put(Attachment(NOISE, "copy.png"))
    assert first.sha256 == again.sha256 and len(list(store.folder.iterdir())) == 1
    assert (
        first.name == "noise.png"
        and first.format == "PNG"
        and first.label().startswith("noise.png · ")
    )
    assert store.get(first) == NOISE
    (store.folder / first.sha256).write_bytes(b"changed")  # a file no longer its hash's
    assert store.get(first) is None
    with pytest.raises(UsageError, match="notes.txt: not an image"):
        store.put(Attachment(b"just text", "notes.txt"))
    assert store.prune(set()) == 0  # named by no message, but just written: left its grace
    age(store.folder)
    assert store.prune(set()) == 1 and not list(store.folder.iterdir())


def test_images_leave_with_the_last_chat_that_names_them(tmp_path: Path) -> None:
    history = History(tmp_path / "chats.sqlite3")
    one = history.create_session(model="m")
    two = history.create_session(model="m")
    refs = json.dumps([{**vars(history.images.put(Attachment(BLUE, "blue.png")))}])
    history.add_message(one, "user", "a", images=refs)
    history.add_message(two, "user", "b", images=refs)
    deleted = history.delete_session(one)
    history.close()
    history = History(tmp_path / "chats.sqlite3")  # opening prunes: chat two still names it
    assert len(list(history.images.folder.iterdir())) == 1
    history.restore_session(deleted)  # an undo brings its images back with its rows
    (message,) = history.messages(one)
    assert refs_from(message.images)[0].name == "blue.png"
    history.delete_session(one)
    history.delete_session(two)
    history.close()
    age(history.images.folder)  # an hour on: no undo, no other process between its steps
    history = History(tmp_path / "chats.sqlite3")
    assert not list(history.images.folder.iterdir())
    history.close()


@pytest.fixture(scope="module")
def loaded(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from localfab.engine import EngineSettings
    from localfab.engine.vision import attach_projector
    from localfab.runtime import load_model

    projector = MMPROJ.write_projector(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf", 640)
    model = load_model(model_path, EngineSettings(n_ctx=1024, n_batch=512))
    attach_projector(model.engine, projector, use_gpu=False)
    yield model
    model.close()


@pytest.mark.model
def test_a_resumed_chat_has_its_images_back_and_an_edit_keeps_them(
    loaded: Any, tmp_path: Path
) -> None:
    from localfab.chat.session import ChatSession
    from localfab.engine import GenerationOptions, SamplingParams

    options = GenerationOptions(max_tokens=3, sampling=SamplingParams(temperature=0))
    history = History(tmp_path / "chats.sqlite3")
    session = ChatSession(loaded.engine, loaded.prompts, history=history)
    pictures = [Attachment(NOISE, "noise.png"), Attachment(BLUE, "blue.png")]
    list(session.send("What is it?", options, images=pictures))
    prompt = list(loaded.engine.cached_tokens)
    (user, _) = history.messages(session.session_id or 0)
    assert user.content == "What is it?"  # the text; the images apart, by name and hash
    assert [r.name for r in refs_from(user.images)] == ["noise.png", "blue.png"]
    assert len(list(history.images.folder.iterdir())) == 2

    loaded.engine.clear_cache()
    encoded = loaded.engine.projector.n_encoded
    again = ChatSession.resume(history, session.session_id or 0, loaded.engine, loaded.prompts)
    # The KV cache rebuilt for the resumed chat holds the images where they were.
    assert list(loaded.engine.cached_tokens)[: len(prompt) - 3] == prompt[: len(prompt) - 3]
    assert sum(t < 0 for t in loaded.engine.cached_tokens) == 2 * MMPROJ.IMAGE_TOKENS
    assert loaded.engine.projector.n_encoded == encoded + 2  # the cache was emptied: again
    list(again.edit(0, "And what colour is it?", options))
    edited = history.messages(session.session_id or 0)[0]
    assert edited.content == "And what colour is it?" and edited.versions == 2
    assert [r.name for r in refs_from(edited.images)] == ["noise.png", "blue.png"]
    history.close()


def test_export_and_import_carry_the_images(tmp_path: Path) -> None:
    history = History(tmp_path / "chats.sqlite3")
    sid = history.create_session(model="m")
    ref = history.images.put(Attachment(BLUE, "blue.png"))
    history.add_message(sid, "user", "Look", images=json.dumps([vars(ref)]))
    history.add_message(sid, "assistant", "Blue.")
    text = export_json(history, sid)
    assert json.loads(text)["messages"][0]["images"][0]["name"] == "blue.png"
    assert "[image: blue.png · 80×48]" in export_markdown(history, sid)
    other = History(tmp_path / "other.sqlite3")
    new = import_json(other, text)
    (look, _) = other.messages(new)
    (back,) = refs_from(look.images)
    assert back.sha256 == ref.sha256 and other.images.get(back) == BLUE
    bad = json.loads(text)
    bad["messages"][0]["images"] = [{"name": "x.png", "data": "bm90IGFuIGltYWdl"}]
    with pytest.raises(UsageError, match="x.png: not an image"):
        import_json(other, json.dumps(bad))
    history.close()
    other.close()


def test_images_go_where_the_message_names_them() -> None:
    from localfab.chat.images import image_message
    from tests.fake_engine import FakeEngine, FakeProjector

    engine = FakeEngine(projector=FakeProjector())

    def plain(text: str) -> list[int]:
        return engine.tokenize(text, add_special=False)

    content, tokens = image_message("A <__media__> then B", [NOISE], engine, plain)
    ids = [t for t in tokens if t < 0]
    assert content == "A <__media__> then B" and len(ids) == 4
    start = tokens.index(ids[0])
    assert tokens[:start] == plain("A ") and tokens[start + 4 :] == plain(" then B")
    content, tokens = image_message("What is it?", [NOISE], engine, plain)
    assert content == "<__media__>\nWhat is it?" and tokens[:4] == ids  # before the text
    with pytest.raises(UsageError, match="names 2 image"):
        image_message("<__media__> or <__media__>", [NOISE], engine, plain)
