"""A damaged file or a pipe in --cache-disk's folder never stops or blocks the server's engine
thread: the request is answered as if the file were not there, with one line in the log."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.engine.disk_cache import SUFFIX, DiskCache
from localfab.server import ServerSettings
from tests.engine.test_disk_cache import HEADER_DAMAGE, rewrite_header
from tests.serverproc import serve_in_process

pytestmark = pytest.mark.model

CHAT = "The lighthouse keeper climbed the spiral stairs every evening to light the lamp. " * 6


def prepare(folder: Path, loaded: Any, damage: str) -> Path:
    """A file in the cache folder that a request for CHAT looks at first: a state file of the
    server's key holding CHAT's beginning, its header damaged, or a pipe of such a name."""
    key = loaded.engine.state_key()
    if damage == "a pipe":
        path = folder / f"{key.id}-{'0' * 20}{SUFFIX}"
        os.mkfifo(path)
        return path
    tokens = loaded.engine.tokenize(CHAT)[:-2]
    DiskCache(folder, key).store(tokens, bytearray(os.urandom(4000)))
    (path,) = folder.glob(f"*{SUFFIX}")
    rewrite_header(path, HEADER_DAMAGE[damage])
    return path


def _release(fifo: Path) -> None:
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize(
    "damage",
    ["negative state_bytes", "state_bytes 10^13", "state_bytes a string", "no sha256", "a pipe"],
)
def test_a_request_is_answered_past_a_bad_file_in_the_cache_folder(
    model_path: Path, tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    caplog.set_level(logging.WARNING, logger="localfab.cache")
    loaded = load_model(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    bad = prepare(tmp_path, loaded, damage)
    settings = ServerSettings(n_parallel=1, cache_ram=0, cache_disk=(tmp_path, 1 << 30))
    server: Iterator[str] = serve_in_process(loaded, settings)
    url = next(server)
    try:
        t0 = time.monotonic()
        body = {"prompt": CHAT + " Why?", "n_predict": 4, "temperature": 0}
        r = httpx.post(url + "/completion", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["timings"]["cache_n"] == 0  # nothing restored from the bad file
        assert time.monotonic() - t0 < 30
        assert httpx.get(url + "/health").status_code == 200
        again = httpx.post(url + "/completion", json={**body, "prompt": "Hi"}, timeout=30)
        assert again.status_code == 200
        notes = [r.getMessage() for r in caplog.records if r.name == "localfab.cache"]
        assert len(notes) == 1 and bad.name in notes[0], notes
        assert bad.exists() == (damage == "a pipe")  # a damaged file goes, a pipe is not ours
    finally:
        if damage == "a pipe":
            _release(bad)
        server.close()
