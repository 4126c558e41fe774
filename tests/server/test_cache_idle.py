"""--cache-idle-slots: as a request starts, idle slots' prompts go to the prompt cache, and with
a unified KV pool leave it, so the running slots have its room; they come back from the cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localfab.server import ServerSettings
from localfab.units import MiB
from tests.greedy import assert_follows
from tests.server.test_cache_ram import CHAT_A, complete, metric
from tests.serverproc import serve_in_process


def serve(model_path: Path, *, idle: bool) -> Iterator[str]:
    from localfab.engine import EngineSettings
    from localfab.runtime import load_model

    engine = EngineSettings(n_ctx=2048, n_batch=512, n_seq_max=2, kv_unified=True)
    loaded = load_model(model_path, engine)
    settings = ServerSettings(
        n_parallel=2, metrics=True, cache_ram=256 * MiB, cache_idle_slots=idle
    )
    yield from serve_in_process(loaded, settings)


@pytest.fixture(scope="module")
def idle(model_path: Path) -> Iterator[str]:
    yield from serve(model_path, idle=True)


@pytest.fixture(scope="module")
def kept(model_path: Path) -> Iterator[str]:
    yield from serve(model_path, idle=False)


def test_an_idle_slot_leaves_the_pool_for_the_cache_and_comes_back(idle: str, kept: str) -> None:
    for url, cached in ((kept, False), (idle, True)):
        saved = metric(url, "localfab:prompt_cache_saved_total")
        hits = metric(url, "localfab:prompt_cache_hits_total")
        first = complete(url, CHAT_A, id_slot=0, n_probs=2)
        assert metric(url, "localfab:prompt_cache_saved_total") == saved  # nothing else idle
        complete(url, "The quick brown fox", id_slot=1)
        # Slot 1 started: slot 0's prompt went to the cache (and left the pool), or stayed.
        assert metric(url, "localfab:prompt_cache_saved_total") == saved + cached
        again = complete(url, CHAT_A, id_slot=0)
        assert again["timings"]["cache_n"] >= first["tokens_evaluated"] - 1
        # The same reply, up to a near-tie (its last token now meets slot 1's cells in the pool).
        assert_follows(first, again["content"])
        # Restored from the cache where it had left the pool; still in the slot otherwise.
        assert metric(url, "localfab:prompt_cache_hits_total") == hits + cached
