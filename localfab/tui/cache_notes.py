"""The app and the prompt cache: the cache a loaded model gets, and what a reply's footer says
about where its prompt came from (restored from the cache, or processed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localfab.units import format_ms

if TYPE_CHECKING:
    from localfab.config import Config, Paths
    from localfab.engine.prompt_cache import Restored
    from localfab.plan import Plan


def attach_prompt_cache(engine: Any, plan: Plan, paths: Paths, config: Config) -> list[str]:
    """Give a loaded model its prompt cache: switching chats keeps the one left in RAM (the
    plan's budget: half the RAM the load leaves free, at most 8 GiB) and on disk, and coming
    back, or reopening it after a restart, restores it. The list the cache's one-line notes
    go to (a state file discarded, a full disk)."""
    from localfab.engine.prompt_cache import open_prompt_cache

    notes: list[str] = []
    engine.use_prompt_cache(
        open_prompt_cache(
            plan.prompt_cache,
            key=engine.state_key(),
            folder=paths.prompt_cache_dir if config.prompt_cache else None,
            disk_limit=config.prompt_cache_disk << 20,
            note=notes.append,
        )
    )
    return notes


# Seconds without a new reply after which the chat's KV state is written to disk, when it
# holds more than IDLE_SLACK tokens that its last file does not (a state is written whole: a
# file per short turn of an 8B model's long chat would be a gigabyte each).
IDLE_PERSIST_S = 20.0
IDLE_SLACK = 256
# A reply's prompt this long (tokens) gets its processing time in the footer.
NOTED_PROMPT = 1000


def window_note(n_tokens: int, seconds: float, restored: Restored | None) -> str:
    """What getting a chat's window into the cache took, for a reply's footer ("" when it was
    short and processed)."""
    if restored is not None and restored.n_tokens:
        return f"{restored.n_tokens:,} tokens restored from cache in {format_ms(seconds * 1e3)}"
    if n_tokens >= NOTED_PROMPT:
        return f"{n_tokens:,} tokens processed in {format_ms(seconds * 1e3)}"
    return ""


def prompt_note(timings: Any, opened: str) -> str:
    """A reply's footer note on its prompt: restored from the prompt cache, long and processed,
    or what opening the chat did (`opened`)."""
    if timings.restored_n:
        return window_note(0, timings.prompt_ms / 1e3, _as_restored(timings))
    if timings.prompt_n >= NOTED_PROMPT:
        return window_note(timings.prompt_n, timings.prompt_ms / 1e3, None)
    return opened


def drain(notes: list[str] | None) -> tuple[str, ...]:
    if not notes:
        return ()
    out = tuple(notes)
    notes.clear()
    return out


def _as_restored(timings: Any) -> Restored:
    from localfab.engine.prompt_cache import Restored

    return Restored(timings.restored_n, timings.restore_ms / 1e3, timings.restored_from)
