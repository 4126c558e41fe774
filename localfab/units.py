"""One vocabulary for every layer: KV cache types, byte sizes, sampling defaults, usage counts.

Imported by the CLI before any command runs, so it imports nothing heavy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard, get_args

# KV cache element types by their llama.cpp names (-ctk / -ctv), in llama.cpp's order: the
# Literal lets a plan's `type_k` / `type_v` hold nothing else, the tuple is what menus offer;
# `is_kv_cache_type` narrows a name read from a user to the Literal.
KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
KV_CACHE_TYPES: tuple[KvCacheType, ...] = get_args(KvCacheType)


def is_kv_cache_type(name: str) -> TypeGuard[KvCacheType]:
    """Whether `name` (exact case) is one of `KV_CACHE_TYPES`."""
    return name in KV_CACHE_TYPES


KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def format_bytes(n: float, *, precise: bool = False) -> str:
    """A byte count in binary units, as llama.cpp and nvidia-smi print them.

    Estimates and free memory: `1.5 GiB`, `340 MiB` (more digits would claim a precision they
    lack). `precise=True` for sizes that were measured (files, downloads): `4.36 GiB`,
    `812.0 MiB`, `3.5 KiB`, `512 B`.
    """
    size = abs(n)
    if not precise:
        return f"{n / GiB:.1f} GiB" if size >= GiB else f"{n / MiB:.0f} MiB"
    if size >= GiB:
        return f"{n / GiB:.2f} GiB"
    if size >= MiB:
        return f"{n / MiB:.1f} MiB"
    if size >= KiB:
        return f"{n / KiB:.1f} KiB"
    return f"{n:.0f} B"


def format_context(n_ctx: int) -> str:
    """A context size in tokens as model lists show it: `128k` (units of 1024), `512` below that."""
    return f"{n_ctx // 1024}k" if n_ctx >= 1024 else str(n_ctx)


def format_duration(seconds: float | None) -> str:
    """A time left or taken, as progress lines show it: `42s`, `3m07s`, `1h05m`; `--` unknown."""
    if seconds is None:
        return "--"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


# llama-server's default --cache-ram (8 GiB): the most RAM a prompt cache takes by default.
PROMPT_CACHE_RAM = 8 << 30


def format_ms(ms: float) -> str:
    """A short time taken, as the app shows it: 420 ms, 5.9 s."""
    return f"{ms:,.0f} ms" if ms < 1000 else f"{ms / 1000:,.1f} s"


@dataclass(frozen=True)
class SamplingDefaults:
    """Sampling defaults with llama.cpp's values; the engine, config and server all read these."""

    temperature: float = 0.8
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0.0 disables
    repeat_penalty: float = 1.0  # 1.0 disables
    repeat_last_n: int = 64  # -1: the whole context


SAMPLING = SamplingDefaults()


def completion_tokens(n_generated: int, stop_type: str) -> int:
    """Tokens a reply counts as generated, as llama-server's `usage` and `predicted_n` count.

    llama-server counts every sampled token, the end-of-generation token included (it is
    sampled and decoded like any other, though it adds no text); `n_generated` are the tokens
    that made text, `stop_type` "eos" when an end-of-generation token ended the reply.
    """
    return n_generated + (1 if stop_type == "eos" else 0)


def usage(prompt_tokens: int, completion: int, *, cached: int | None = None) -> dict[str, Any]:
    """The OpenAI-style `usage` object; `cached`: prompt tokens reused from the KV cache."""
    result: dict[str, Any] = {
        "completion_tokens": completion,
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion,
    }
    if cached is not None:
        result["prompt_tokens_details"] = {"cached_tokens": cached}
    return result


def human_size(n: int | None) -> str:
    """`4.36 GiB`, `812.0 MiB`, `-` for unknown."""
    return "-" if n is None else format_bytes(n, precise=True)


def human_age(ts: float | None, *, now: float | None = None) -> str:
    """`just now`, `5 min ago`, `3 h ago`, `2 days ago`, `never`."""
    if ts is None:
        return "never"
    age = max((time.time() if now is None else now) - ts, 0)
    if age < 60:
        return "just now"
    if age < 3600:
        return f"{int(age // 60)} min ago"
    if age < 86400:
        return f"{int(age // 3600)} h ago"
    return f"{int(age // 86400)} days ago"
