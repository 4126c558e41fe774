"""KV cache element types as a type: the names `-ctk` / `-ctv` take, checked once at the edge.

`KvCacheType` (defined in `units`, next to `KV_CACHE_TYPES`) keeps a plan's `type_k` / `type_v`
to llama.cpp's names; `check_kv_type` turns what a user typed into one, or says which names there
are.
"""

from __future__ import annotations

from localfab.errors import UsageError
from localfab.units import KV_CACHE_TYPES, KvCacheType, is_kv_cache_type

__all__ = ["KV", "KvCacheType", "check_kv_type"]

KV = tuple[KvCacheType, KvCacheType]  # (type_k, type_v)


def check_kv_type(name: str, flag: str) -> KvCacheType:
    """`name` (any case) as a KV cache type; a UsageError naming `flag` and the choices if not."""
    name = name.lower()
    if is_kv_cache_type(name):
        return name
    raise UsageError(
        f"{flag} {name}: unknown KV cache type; use one of {', '.join(KV_CACHE_TYPES)}"
    )
