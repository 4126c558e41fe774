"""A sequence's KV state saved and restored: the reply after it is the reply from the live state."""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab.engine import Engine, EngineSettings, GenerationOptions, SamplingParams
from localfab.engine.prompt_cache import PromptCache

GREEDY = GenerationOptions(max_tokens=24, sampling=SamplingParams.greedy())
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening to light the lamp. "
    "Ships passing the rocky coast relied on its beam to find their way home. "
) * 3


def reply(engine: Engine, prompt: list[int]) -> tuple[int, ...]:
    """The greedy reply to `prompt`, from whatever the cache holds."""
    return engine.generate(prompt, GREEDY).tokens


# Each load whose KV contents differ: the defaults, a quantized cache, flash attention off, a
# sliding-window cache of window size, and two parallel sequences.
LOADS = {
    "default": EngineSettings(n_ctx=1024),
    "q8_0 cache": EngineSettings(n_ctx=1024, type_k="q8_0", type_v="q8_0", flash_attn="on"),
    "flash attention off": EngineSettings(n_ctx=1024, flash_attn="off"),
    "sliding window": EngineSettings(n_ctx=1024, swa_full=False),
    "two sequences": EngineSettings(n_ctx=2048, n_seq_max=2),
}


@pytest.mark.parametrize("load", LOADS, ids=list(LOADS))
def test_a_restored_state_gives_the_reply_of_the_live_one(model_path: Path, load: str) -> None:
    # The next turn of a chat: the saved prompt, then a question after it (a sliding-window
    # cache cannot drop its last cells, so the prompt grows as a chat's does).
    with Engine(model_path, LOADS[load]) as engine:
        prompt = engine.tokenize(TEXT)
        turn = prompt + engine.tokenize(" What did the keeper do?", add_special=False)
        engine.evaluate(prompt)
        kv = engine.kv
        held = list(kv.cached)
        saved = kv.save_state()
        live = engine.generate(turn, GREEDY)  # from the live state
        engine.clear_cache()
        assert kv.restore_state(saved, held) and kv.cached == held
        assert kv.pos_max() == len(held) - 1
        restored = engine.generate(turn, GREEDY)
        assert restored.tokens == live.tokens
        assert restored.timings.cache_n == live.timings.cache_n == len(prompt)


def test_a_restored_prefix_then_new_tokens_match_processing_them_at_once(model_path: Path):
    # The new tokens are one batch of more than 8 after the prefix either way, so llama.cpp
    # takes the same kernels for them (a batch of 1-7 could differ, see engine.spec).
    with Engine(model_path, EngineSettings(n_ctx=1024)) as engine:
        head = engine.tokenize(TEXT)
        tail = engine.tokenize(" Tonight a storm was coming in from the sea.", add_special=False)
        assert len(tail) > 8
        engine.evaluate(head)
        saved, held = engine.kv.save_state(), list(engine.kv.cached)
        engine.clear_cache()
        at_once = engine.generate(head + tail, GREEDY)
        assert at_once.timings.cache_n == 0
        engine.clear_cache()
        assert engine.kv.restore_state(saved, held)
        after = engine.generate(head + tail, GREEDY)
        assert after.timings.cache_n == len(head)
        assert after.tokens == at_once.tokens


def test_a_state_of_another_layout_is_refused_and_leaves_the_sequence_empty(model_path: Path):
    with Engine(model_path, EngineSettings(n_ctx=1024)) as one:
        prompt = one.tokenize(TEXT)
        one.evaluate(prompt)
        saved, held = one.kv.save_state(), list(one.kv.cached)
    with Engine(model_path, EngineSettings(n_ctx=1024, type_k="q8_0", flash_attn="on")) as other:
        other.evaluate(prompt[:10])
        assert not other.kv.restore_state(saved, held)
        assert other.kv.cached == [] and other.kv.pos_max() == -1
        assert reply(other, prompt) == reply(other, prompt)  # and it goes on working


def test_a_slot_keeps_its_prompt_for_another_and_gets_it_back(model_path: Path):
    with Engine(model_path, EngineSettings(n_ctx=1024)) as engine:
        cache = PromptCache(limit=None)
        kv = engine.kv
        kv.prompt_cache = cache
        chat_a = engine.tokenize(TEXT)
        chat_b = engine.tokenize("A completely different conversation about baking bread. " * 4)
        kv.swap_with_cache(chat_a)
        first = reply(engine, chat_a)
        kv.swap_with_cache(chat_b)  # chat A's cells are kept before B's prompt replaces them
        assert len(cache.entries) == 1 and cache.entries[0].tokens[: len(chat_a)] == tuple(chat_a)
        reply(engine, chat_b)
        kv.swap_with_cache(chat_a)  # back to A: its state returns, B's is kept
        assert kv.common_prefix(chat_a) == len(chat_a)
        assert cache.stats.hits == 1 and cache.stats.tokens_restored == len(chat_a)
        assert [e.tokens[0] for e in cache.entries] == [chat_b[0]]
        assert reply(engine, chat_a) == first


DISK_LOADS = ["default", "sliding window", "q8_0 cache"]


@pytest.mark.parametrize("load", DISK_LOADS)
def test_a_state_from_disk_after_a_restart_gives_the_reply_of_the_live_one(
    model_path: Path, tmp_path: Path, load: str
) -> None:
    from localfab.engine.disk_cache import DiskCache

    def opened() -> Engine:
        engine = Engine(model_path, LOADS[load])
        engine.use_prompt_cache(PromptCache(0, disk=DiskCache(tmp_path, engine.state_key())))
        return engine

    with opened() as engine:
        prompt = engine.tokenize(TEXT)
        turn = prompt + engine.tokenize(" What did the keeper do?", add_special=False)
        engine.evaluate(prompt)
        assert engine.persist_prompt() > 0
        assert engine.persist_prompt() == 0  # the file holds it already
        live = engine.generate(turn, GREEDY)
    with opened() as engine:  # a new process's engine: only the file remains
        restored = engine.generate(turn, GREEDY)
    assert restored.timings.restored_from == "disk"
    assert restored.timings.restored_n == restored.timings.cache_n == len(prompt)
    assert restored.tokens == live.tokens


def test_a_state_file_of_another_load_is_not_used(model_path: Path, tmp_path: Path) -> None:
    from localfab.engine.disk_cache import DiskCache

    with Engine(model_path, LOADS["default"]) as engine:
        engine.use_prompt_cache(PromptCache(0, disk=DiskCache(tmp_path, engine.state_key())))
        prompt = engine.tokenize(TEXT)
        engine.evaluate(prompt)
        engine.persist_prompt()
    with Engine(model_path, LOADS["q8_0 cache"]) as other:
        notes: list[str] = []
        disk = DiskCache(tmp_path, other.state_key(), note=notes.append)
        assert disk.key_id != DiskCache(tmp_path, engine.state_key()).key_id
        other.use_prompt_cache(PromptCache(0, disk=disk))
        done = other.generate(prompt, GREEDY)
        assert done.timings.restored_n == 0 and notes == []


def test_a_draft_models_sequence_is_kept_and_restored_beside_the_models(
    model_path: Path, tmp_path: Path
) -> None:
    from localfab.engine.prompt_cache import open_prompt_cache
    from localfab.engine.types import SpecSettings

    settings = EngineSettings(n_ctx=1024, batch_invariant=True, type_k="q8_0", type_v="q8_0")
    spec = SpecSettings(
        spec_type="draft-simple", model_draft=str(model_path), draft_max=6, adaptive=False
    )

    def opened() -> Engine:
        engine = Engine(model_path, settings)
        engine.set_speculation(spec, engine.load_draft(model_path))
        key = engine.state_key()
        engine.use_prompt_cache(open_prompt_cache(0, key=key, folder=tmp_path, disk_limit=1 << 30))
        return engine

    with opened() as engine:
        prompt = engine.tokenize(TEXT)
        turn = prompt + engine.tokenize(" What did the keeper do?", add_special=False)
        live = engine.generate(prompt, GREEDY)  # the model and its draft both hold the prompt
        assert engine.persist_prompt() > 0
        assert len(list(tmp_path.glob("*.lfkv"))) == 2  # the model's state and the draft's
        after_live = engine.generate(turn, GREEDY)
    with opened() as engine:
        draft = engine.draft_engine
        assert draft is not None and draft.kv.prompt_cache is not None
        restored = engine.generate(turn, GREEDY)
        assert restored.timings.restored_from == "disk"
        # The draft got its own sequence back: it processed only the question, not the prompt.
        assert draft.kv.prompt_cache.stats.disk_hits == 1
    assert restored.tokens == after_live.tokens and live.tokens


def test_a_stale_state_file_that_llama_cpp_refuses_is_discarded_with_a_note(
    model_path: Path, tmp_path: Path
) -> None:
    from localfab.engine.disk_cache import DiskCache

    with Engine(model_path, LOADS["default"]) as one:
        prompt = one.tokenize(TEXT)
        one.evaluate(prompt)
        saved, held = one.kv.save_state(), list(one.kv.cached)
    with Engine(model_path, LOADS["q8_0 cache"]) as other:
        notes: list[str] = []
        disk = DiskCache(tmp_path, other.state_key(), note=notes.append)
        disk.store(held, saved)  # an f16 state under the q8_0 load's key: stale
        other.use_prompt_cache(PromptCache(0, disk=disk))
        done = other.generate(prompt, GREEDY)
        assert done.timings.restored_n == 0 and done.timings.cache_n == 0
        assert len(notes) == 1 and "refused" in notes[0]
        assert list(tmp_path.glob("*.lfkv")) == []
        assert other.prompt_cache is not None and other.prompt_cache.stats.failed == 1
