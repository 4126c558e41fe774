"""POST /slots/{id}?action=save|restore|erase: a slot's prompt to a file and back."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.server import ServerSettings, create_app
from localfab.server.runner import BackgroundServer
from localfab.server.slot_files import valid_filename
from tests import serverproc

PROMPT = "The lighthouse keeper climbed the spiral stairs every evening to light the lamp. " * 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


def start(model_path: Path, settings: ServerSettings) -> tuple[Any, BackgroundServer]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    loaded = load_model(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    server = BackgroundServer(create_app(loaded, settings)).start()
    deadline = time.monotonic() + 60
    while httpx.get(server.url + "/health").status_code != 200:
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.05)
    return loaded, server


@pytest.fixture(scope="module")
def url(model_path: Path, folder: Path) -> Iterator[str]:
    loaded, server = start(model_path, ServerSettings(slot_save_path=folder))
    yield server.url
    server.stop()
    loaded.close()


def action(url: str, what: str, slot: Any = 0, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/slots/{slot}?action={what}", json=body, timeout=120)


def complete(url: str, prompt: str) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0}
    r = httpx.post(url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_saved_slot_comes_back_after_an_erase(url: str, folder: Path) -> None:
    first = complete(url, PROMPT)
    saved = action(url, "save", filename="keeper.bin")
    assert saved.status_code == 200, saved.text
    s = saved.json()
    assert s["id_slot"] == 0 and s["filename"] == "keeper.bin"
    assert s["n_saved"] == first["tokens_evaluated"] + first["tokens_predicted"] - 1
    assert s["n_written"] == (folder / "keeper.bin").stat().st_size > 0
    assert s["timings"]["save_ms"] >= 0
    erased = action(url, "erase").json()
    assert erased == {"id_slot": 0, "n_erased": s["n_saved"]}
    restored = action(url, "restore", filename="keeper.bin").json()
    assert restored["n_restored"] == s["n_saved"] and restored["n_read"] == s["n_written"]
    again = complete(url, PROMPT + " Why?")
    assert again["timings"]["cache_n"] >= first["tokens_evaluated"] - 1
    assert complete(url, PROMPT)["content"] == first["content"]


@pytest.mark.parametrize(
    ("what", "slot", "body", "message"),
    [
        ("save", 0, {"filename": "../escape.bin"}, "Invalid filename"),
        ("save", 0, {"filename": "sub/dir.bin"}, "Invalid filename"),
        ("save", 0, {}, "Invalid filename"),
        ("restore", 0, {"filename": "never-saved.bin"}, "Unable to restore slot"),
        ("nap", 0, {"filename": "a.bin"}, "Invalid action"),
        ("save", "first", {"filename": "a.bin"}, "Invalid slot ID"),
        ("save", 7, {"filename": "a.bin"}, "Invalid slot ID"),
    ],
)
def test_bad_requests_get_llama_servers_errors(
    url: str, folder: Path, what: str, slot: Any, body: dict[str, Any], message: str
) -> None:
    r = action(url, what, slot, **body)
    assert r.status_code in (400, 500) and message in r.json()["error"]["message"]
    assert not (folder.parent / "escape.bin").exists()


def test_a_file_that_is_not_a_state_is_refused_and_the_slot_goes_on(url: str, folder: Path):
    (folder / "junk.bin").write_bytes(b"not a state file" * 100)
    r = action(url, "restore", filename="junk.bin")
    assert r.status_code == 500 and "Unable to restore slot" in r.json()["error"]["message"]
    assert complete(url, PROMPT)["tokens_predicted"] == 8


def test_without_a_folder_the_actions_are_not_supported(model_path: Path) -> None:
    loaded, server = start(model_path, ServerSettings())
    try:
        r = action(server.url, "save", filename="a.bin")
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    finally:
        server.stop()
        loaded.close()


def test_file_names_that_stay_in_the_folder() -> None:
    for good in ("slot0.bin", "chat 1.state", "ünïcode.bin"):
        assert valid_filename(good), good
    for bad in ("", "..", "a/b", "a\\b", "x:y", "bad?", " lead", "trail ", "end.", "ctl\x01",
                "a" * 256):  # fmt: skip
        assert not valid_filename(bad), bad


def test_a_file_cut_short_is_a_400_and_the_server_lives(model_path: Path, tmp_path: Path) -> None:
    # In a child process: llama.cpp's own reader aborts the process on such a file.
    with serverproc.serve(model_path, "-c", "2048", "--slot-save-path", str(tmp_path)) as server:
        complete(server.url, PROMPT)
        assert action(server.url, "save", filename="whole.bin").status_code == 200
        whole = (tmp_path / "whole.bin").read_bytes()
        for cut in (1, 2, 17, 4096, len(whole) // 2, len(whole) - 20):
            (tmp_path / "cut.bin").write_bytes(whole[:-cut])
            r = action(server.url, "restore", filename="cut.bin")
            assert server.alive(), f"cut by {cut}: the server died"
            assert r.status_code == 400, (cut, r.text)
            assert "cut short" in r.json()["error"]["message"], r.text
        assert httpx.get(server.url + "/health").status_code == 200
        assert action(server.url, "restore", filename="whole.bin").status_code == 200
        assert complete(server.url, PROMPT)["tokens_predicted"] == 8


@pytest.fixture()
def outside(folder: Path) -> Iterator[Path]:
    """A file outside the slot folder, and the names in the folder that lead to it."""
    target = folder.parent / "outside.bin"
    target.write_bytes(b"precious")
    yield target
    target.unlink(missing_ok=True)
    for name in ("link.bin", "dangling.bin"):
        (folder / name).unlink(missing_ok=True)


def test_a_save_never_writes_through_a_link_out_of_the_folder(
    url: str, folder: Path, outside: Path
) -> None:
    complete(url, PROMPT)
    (folder / "link.bin").symlink_to(outside)
    (folder / "dangling.bin").symlink_to(folder.parent / "created-outside.bin")
    for name in ("link.bin", "dangling.bin"):
        r = action(url, "save", filename=name)
        assert r.status_code == 400 and "symbolic link" in r.json()["error"]["message"], r.text
    assert outside.read_bytes() == b"precious"
    assert not (folder.parent / "created-outside.bin").exists()


def test_a_restore_never_reads_through_a_link_out_of_the_folder(
    url: str, folder: Path, outside: Path
) -> None:
    complete(url, PROMPT)
    assert action(url, "save", filename="real.bin").status_code == 200
    outside.write_bytes((folder / "real.bin").read_bytes())  # a slot file, but outside
    (folder / "link.bin").symlink_to(outside)
    r = action(url, "restore", filename="link.bin")
    assert r.status_code == 400 and "symbolic link" in r.json()["error"]["message"], r.text
    assert action(url, "restore", filename="real.bin").status_code == 200


def test_a_pipe_in_the_folder_is_refused_at_once(url: str, folder: Path) -> None:
    os.mkfifo(folder / "pipe.bin")
    try:
        r = action(url, "restore", filename="pipe.bin")
        assert r.status_code == 400 and "not a regular file" in r.json()["error"]["message"]
    finally:
        (folder / "pipe.bin").unlink()
