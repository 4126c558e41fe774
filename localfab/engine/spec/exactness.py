"""Which batches llama.cpp computes exactly as it computes one token, on this load.

Exact speculative decoding verifies no more tokens at once than `exact_batch` finds to give,
bit for bit, the logits of one-token decodes (see `localfab.engine.spec`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from localfab.engine.types import ONE_THREAD_CELLS

if TYPE_CHECKING:
    from localfab.engine.handle import Handle
    from localfab.engine.kvcache import KVCache

# Batch sizes probed for bit-identical logits (the pending token and up to 15 drafted ones).
PROBE_MAX = 16
# With repacked weights llama.cpp computes 4 rows of a batch at a time from 4 tokens on, with
# other kernels than one row; whether those round as one token's do depends on the data (a probe
# found 7 exact on an AVX-512 CPU, and a reply parted from plain decoding at its 88th token), so
# no probe vouches for them.
_REPACKED_MAX = 3
_PROBE_TEXT = (
    "The quick brown fox jumps over the lazy dog while the farmer counts his sheep and the "
    "children sing in the old school by the river. In the evening, 42 lamps were lit; "
    "nobody knew why the bell rang twice, or who had left the gate open at the mill."
)


def exact_batch(engine: Handle, n_max: int = PROBE_MAX) -> tuple[int, int]:
    """The largest batches whose logits equal, bit for bit, those of one-token decodes: for a
    verify that ends within `ONE_THREAD_CELLS` of cache, and for one past them.

    llama.cpp switches to other CPU kernels for larger batches (8 tokens and more, 4 with
    repacked weights; `EngineSettings.batch_invariant` avoids both), whose results differ in
    the last bits; verifying no more tokens at once than this keeps a verified position's
    logits those of plain decoding. Probed at two lengths of the cache: up to 256 cells, and,
    where the context holds it, past them, where flash attention over an f16 cache splits one
    token over the threads (a batch is not split: there a cache whose K or V is quantized
    stays exact). Clears the cache.
    """
    if engine.buffers.repacked_bytes:
        n_max = min(n_max, _REPACKED_MAX)
    kv = engine.kv
    n_max = max(1, min(n_max, kv.n_batch))
    # Enough text for the longest verify past ONE_THREAD_CELLS (58 tokens a copy here).
    toks = engine.tokenize(_PROBE_TEXT * (2 + (_PROBE_PAST + n_max) // 50))
    try:
        short = min(_PROBE_SHORT, kv.n_ctx - 1, len(toks))
        n_max = max(1, min(n_max, short // 2))
        kv.clear()
        kv.decode(toks[: short - n_max], 0)
        within = past = _exact_at(kv, toks[:short], n_max)
        long = _PROBE_PAST + within
        if within > 1 and kv.n_ctx > ONE_THREAD_CELLS:
            if long < kv.n_ctx:
                kv.decode(toks[short - n_max : _PROBE_PAST], short - n_max)
                past = _exact_at(kv, toks[:long], within)
            else:  # a context too small for the probe: no verify past them
                past = 1
    finally:
        kv.clear()
    return within, past


# The probe's verifies end near 256 cells of cache (one token's attention on one thread), then
# run again past them (for an f16 or f32 cache split over the threads, a batch's is not).
_PROBE_SHORT = 240
_PROBE_PAST = ONE_THREAD_CELLS + 8
# Sizes a verify is tried at before all are: each where llama.cpp changes kernels (4 rows with
# repacked weights, 8 with its tiled ones) and the largest; all only when one of them fails.
_PROBE_SIZES = (2, 3, 4, 8)


def _exact_at(kv: KVCache, toks: Sequence[int], n_max: int) -> int:
    """The largest verify, up to `n_max` tokens ending at len(toks), whose rows equal those of
    one-token decodes; the cache holds toks[: len(toks) - n_max]."""
    at = len(toks) - n_max
    tail = list(toks[at:])
    want = []
    for tok in tail:
        kv.decode_one(tok)
        want.append(kv.logits().copy())

    def exact(b: int) -> bool:
        kv.truncate(at)
        rows = kv.decode_rows(tail[:b], at)
        return all(np.array_equal(rows[i], want[i]) for i in range(b))

    sizes = [b for b in (*_PROBE_SIZES, n_max) if b <= n_max]
    if all(exact(b) for b in sizes):
        best = n_max
    else:
        best = 1
        for b in range(2, n_max + 1):
            if not exact(b):
                break
            best = b
    kv.truncate(at)
    return best
