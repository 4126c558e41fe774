"""The server's prompt cache: two chats taking turns on one slot each get their prompt back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.commands.serve import DEFAULT_CACHE_RAM_MIB, cache_ram_limit
from localfab.errors import UsageError
from localfab.server import ServerSettings
from localfab.units import MiB
from tests.serverproc import serve_in_process

CHAT_A = "The lighthouse keeper climbed the spiral stairs every evening to light the lamp. " * 6
CHAT_B = "Bread dough rises best in a warm kitchen, covered with a damp cloth. " * 6


def serve(
    model_path: Path, cache_ram: int | None, cache_disk: tuple[Path, int] | None = None
) -> Iterator[str]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    loaded = load_model(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    settings = ServerSettings(
        n_parallel=1, metrics=True, cache_ram=cache_ram, cache_disk=cache_disk
    )
    yield from serve_in_process(loaded, settings)


@pytest.fixture(scope="module")
def cached(model_path: Path) -> Iterator[str]:
    yield from serve(model_path, cache_ram=256 * MiB)


@pytest.fixture(scope="module")
def uncached(model_path: Path) -> Iterator[str]:
    yield from serve(model_path, cache_ram=0)


def complete(url: str, prompt: str, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, **extra}
    r = httpx.post(url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_two_chats_taking_turns_get_their_prompts_back(cached: str, uncached: str) -> None:
    hits = metric(cached, "localfab:prompt_cache_hits_total")
    a1 = complete(cached, CHAT_A)
    complete(cached, CHAT_B)  # the slot's prompt (chat A) is kept before B replaces it
    a2 = complete(cached, CHAT_A + " Why?")
    assert a2["timings"]["cache_n"] >= a1["tokens_evaluated"] - 1  # only the question ran
    assert metric(cached, "localfab:prompt_cache_hits_total") == hits + 1
    assert metric(cached, "localfab:prompt_cache_bytes") > 0
    (slot,) = httpx.get(cached + "/slots").json()
    assert slot["n_prompt_tokens_restored"] == a2["timings"]["cache_n"]  # this request's
    assert slot["prompt_cache"]["hits"] == hits + 1 and slot["prompt_cache"]["bytes"] > 0
    # The same turns without the cache: the whole of A is processed again.
    complete(uncached, CHAT_A)
    complete(uncached, CHAT_B)
    plain = complete(uncached, CHAT_A + " Why?")
    assert plain["timings"]["cache_n"] <= 1
    assert plain["content"] == a2["content"]  # and the reply is the same


def test_cache_prompt_false_neither_reuses_nor_restores(cached: str) -> None:
    complete(cached, CHAT_A)
    complete(cached, CHAT_B)
    again = complete(cached, CHAT_A + " Why?", cache_prompt=False)
    assert again["timings"]["cache_n"] == 0


def test_the_cache_ram_flag_says_bytes_with_llama_servers_meanings() -> None:
    assert cache_ram_limit(-1) is None
    assert cache_ram_limit(0) == 0
    assert cache_ram_limit(512) == 512 * MiB
    default = cache_ram_limit(None)
    assert default is not None and 0 < default <= DEFAULT_CACHE_RAM_MIB * MiB
    with pytest.raises(UsageError, match="--cache-ram"):
        cache_ram_limit(-2)


def test_with_cache_disk_a_restarted_server_gets_a_chat_back_from_the_cache_folder(
    model_path: Path, tmp_path: Path
) -> None:
    disk = (tmp_path / "prompts", 64 * MiB)
    first = serve(model_path, cache_ram=0, cache_disk=disk)  # the disk tier alone
    url = next(first)
    a = complete(url, CHAT_A)
    complete(url, CHAT_B)  # A's state leaves the slot: written to the folder
    first.close()  # the server stops: the slot's prompt (B) is written too
    assert len(list(disk[0].glob("*.lfkv"))) == 2
    second = serve(model_path, cache_ram=0, cache_disk=disk)
    url = next(second)
    try:
        again = complete(url, CHAT_A)
        n_prompt = again["timings"]["cache_n"] + again["timings"]["prompt_n"]
        assert again["timings"]["cache_n"] >= n_prompt - 1  # all but the last token restored
        assert again["content"] == a["content"]
        assert metric(url, "localfab:prompt_cache_hits_total") == 1
        assert metric(url, "localfab:prompt_cache_disk_hits_total") == 1
    finally:
        second.close()


def test_cache_disk_is_off_unless_asked_and_refuses_a_negative_size() -> None:
    from localfab.commands.serve import cache_disk

    assert cache_disk(0) is None
    folder, limit = cache_disk(100) or (None, 0)
    assert folder is not None and folder.name == "prompts" and limit == 100 * MiB
    with pytest.raises(UsageError, match="--cache-disk"):
        cache_disk(-1)
