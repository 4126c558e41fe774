"""KV-cache bookkeeping for one sequence: which tokens are cached, prefix reuse, shift, rebase.

A context may hold several sequences (the server's parallel slots): each has its own `KVCache`
on its own sequence id, and never touches the others' cells.

`KVCache.cached` mirrors llama.cpp's cache: the tokens whose KV cells sit at positions
0..len-1, in order. Every decode, removal and shift goes through this class so the mirror never
drifts from what llama.cpp holds; after a failed decode it is cut back to what the cache really
has.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from typing import Any, BinaryIO, NoReturn

import llama_cpp as lc
import numpy as np

from localfab.engine import seq_file
from localfab.engine.image_ids import Images, image_end, image_start
from localfab.engine.prompt_cache import PromptCache, Restored, common_prefix
from localfab.errors import ContextOverflow, LocalfabError

# A shift is worth it only when the part it keeps is longer than re-processing would cost.
_MIN_SHIFT_KEEP = 8
# Tokens matched to find where a prompt's continuation starts again in the cache.
_SHIFT_KEY = 4


class KVCache:
    """One sequence of a llama.cpp context, with the batches that feed it and its logits.

    `n_ctx` is what this sequence may hold; `shared`: other sequences live in the same context,
    so clearing removes only this one's cells.
    """

    def __init__(
        self,
        ctx: Any,
        n_ctx: int,
        n_batch: int,
        n_vocab: int,
        *,
        seq: int = 0,
        shared: bool = False,
    ) -> None:
        self.ctx = ctx
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        # llama.cpp computes a batch one micro-batch at a time: a prompt fed in chunks of this
        # size costs the same and can stop between any two of them.
        self.n_ubatch = max(1, min(int(lc.llama_n_ubatch(ctx)), n_batch))
        self.n_vocab = n_vocab
        self.seq = seq
        self.shared = shared
        self.mem = lc.llama_get_memory(ctx)
        self._batch = lc.llama_batch_init(n_batch, 0, 1)
        self._one = lc.llama_batch_init(1, 0, 1)  # the generation step's batch, pre-filled
        self._one.n_tokens = 1
        self._one.n_seq_id[0] = 1
        self._one.seq_id[0][0] = seq
        self._one.logits[0] = 1
        self._logits_address: int | None = None
        self._logits_view: np.ndarray[Any, np.dtype[np.float32]] = np.zeros(0, dtype=np.float32)
        # Tokens whose KV cells sit in the cache at positions 0..len-1, in order. Only ever
        # changed in place, so a generation loop may hold it in a local.
        self.cached: list[int] = []
        # The last verify batch (start, n), and after a truncate that cut it: (cache length,
        # the batch row of the last kept token or None). Read by `last_row`; the token loop
        # never touches either.
        self._rows = (0, 0)
        self._after_cut: tuple[int, int | None] | None = None
        # Where this sequence keeps what it is about to drop, and finds prompts it held before
        # (None: nowhere). Only sequences that run requests have one, never a draft's.
        self.prompt_cache: PromptCache | None = None
        # The model's vision projector, which evaluates the image runs of a prompt (None: the
        # prompts hold text only).
        self.images: Images | None = None

    def free(self) -> None:
        """Free the batches (the context belongs to the engine)."""
        if self._batch is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if self._one is not None:
            lc.llama_batch_free(self._one)
            self._one = None

    @property
    def can_shift(self) -> bool:
        """Whether KV cells can be moved (False for recurrent and M-RoPE models)."""
        return bool(lc.llama_memory_can_shift(self.mem))

    # --- evaluation --------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int], start: int, *, logits_last: bool = True) -> None:
        """Evaluate tokens at positions start.. in batches; their KV cells join the cache."""
        if self.images is not None and tokens and min(tokens) < 0:  # images among them
            self.images.decode(self, tokens, start, logits_last=logits_last)
            self._after_cut = None if logits_last else (len(self.cached), None)
            return
        n_batch = self.n_batch
        batch = self._batch
        for off in range(0, len(tokens), n_batch):
            chunk = tokens[off : off + n_batch]
            n = len(chunk)
            p0 = start + off
            self._fill(chunk, p0, all_logits=False)
            if logits_last and off + n >= len(tokens):
                batch.logits[n - 1] = 1
            rc = lc.llama_decode(self.ctx, batch)
            if rc != 0:
                self._decode_failed(rc, start + len(tokens))
            del self.cached[p0:]
            self.cached.extend(chunk)
        self._after_cut = None if logits_last else (len(self.cached), None)

    def _fill(self, tokens: Sequence[int], start: int, *, all_logits: bool) -> None:
        """Put `tokens` in the batch at positions start.. of this sequence (logits for all, or
        for none: the caller marks the one it wants)."""
        batch = self._batch
        token, pos, n_seq, seq_id, logits = (
            batch.token,
            batch.pos,
            batch.n_seq_id,
            batch.seq_id,
            batch.logits,
        )
        want = 1 if all_logits else 0
        seq = self.seq
        for i, tok in enumerate(tokens):
            token[i] = tok
            pos[i] = start + i
            n_seq[i] = 1
            seq_id[i][0] = seq
            logits[i] = want
        batch.n_tokens = len(tokens)

    def _decode_failed(self, rc: int, n_tokens: int) -> NoReturn:
        # Keep our view equal to what the cache really holds, then report.
        self.sync_after_failure()
        if rc == 1:
            raise ContextOverflow(
                n_tokens,
                self.n_ctx,
                "the KV cache has no room left for this batch: "
                "raise the context with -c or shorten the conversation",
            )
        raise LocalfabError(f"llama.cpp failed to evaluate the prompt (llama_decode returned {rc})")

    def decode_one(self, tok: int) -> None:
        """The decode step of generation: one token, its logits wanted (a pre-filled batch)."""
        one = self._one
        n_past = len(self.cached)
        one.token[0] = tok
        one.pos[0] = n_past
        rc = lc.llama_decode(self.ctx, one)
        if rc != 0:
            self.sync_after_failure()
            raise LocalfabError(f"llama.cpp failed to decode a token (llama_decode returned {rc})")
        self.cached.append(tok)

    def logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The last output's logits as a numpy view (re-made only if llama.cpp moved them)."""
        ptr = lc.llama_get_logits_ith(self.ctx, -1)
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        if address != self._logits_address:
            self._logits_view = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            self._logits_address = address
        return self._logits_view

    def decode_rows(
        self, tokens: Sequence[int], start: int
    ) -> np.ndarray[Any, np.dtype[np.float32]]:
        """Evaluate `tokens` (one batch) at positions start.., with logits for every one.

        This is the verify step of speculative decoding; row i of the result is what the
        model predicts after tokens[i]. The rows are a view of llama.cpp's buffer, valid
        until the next decode.
        """
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"{n} tokens do not fit one batch of {self.n_batch}")
        self._fill(tokens, start, all_logits=True)
        rc = lc.llama_decode(self.ctx, self._batch)
        if rc != 0:
            self._decode_failed(rc, start + n)
        del self.cached[start:]
        self.cached.extend(tokens)
        self._rows = (start, n)
        self._after_cut = None
        ptr = lc.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab))

    def truncate(self, n: int) -> None:
        """Remove the cells at positions n.. (drafted tokens the model did not keep).

        A cache that cannot drop a partial range (recurrent models) is evaluated again up to
        n, so the mirror and the cache stay equal either way.
        """
        if n >= len(self.cached):
            return
        if lc.llama_memory_seq_rm(self.mem, self.seq, n, -1):
            del self.cached[n:]
            start, count = self._rows
            self._after_cut = (n, n - 1 - start if start <= n - 1 < start + count else None)
            return
        keep = self.cached[:n]
        self.clear()
        if keep:
            self.decode(keep, 0, logits_last=False)

    def last_row(self) -> int | None:
        """The output row (for llama_get_logits_ith) holding the logits after the last cached
        token: -1, the batch's last, unless a truncate cut the batch (then the kept token's
        own row, or None when it has none)."""
        cut = self._after_cut
        if cut is not None and cut[0] == len(self.cached):
            return cut[1]
        return -1

    def pos_max(self) -> int:
        """The highest position llama.cpp holds for the sequence (-1 when empty)."""
        return int(lc.llama_memory_seq_pos_max(self.mem, self.seq))

    def sync_after_failure(self) -> None:
        pos_max = lc.llama_memory_seq_pos_max(self.mem, self.seq)
        del self.cached[pos_max + 1 :]

    # --- reuse, shift, rebase ----------------------------------------------------------------

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading tokens the cache shares with `tokens`."""
        return common_prefix(self.cached, tokens)

    def evaluate(self, tokens: Sequence[int]) -> int:
        """Put `tokens` in the cache (the last one's logits computed); returns how many came
        from the cache."""
        n = self.reuse_prefix(tokens)
        self.decode(list(tokens[n:]), n, logits_last=True)
        return n

    def reuse_prefix(self, tokens: Sequence[int], *, need_logits: bool = True) -> int:
        """Drop cache cells past the common prefix with `tokens`; return how many are reused.

        With `need_logits`, a prompt that is wholly cached keeps its last token out, so that
        evaluating it again yields the logits to sample from.
        """
        cached = self.cached
        lcp = self.common_prefix(tokens)
        if need_logits and lcp == len(tokens) and lcp > 0:
            lcp -= 1
        lcp = image_start(tokens, lcp)  # an image is evaluated whole, never from its middle
        if lcp < len(cached):
            if not lc.llama_memory_seq_rm(self.mem, self.seq, lcp, -1):
                # Some caches (sliding window without swa_full, recurrent) cannot drop a
                # partial range: start over.
                self._wipe()
                lcp = 0
            del self.cached[lcp:]
        return lcp

    # --- state: the sequence's cells as bytes --------------------------------------------------

    def save_state(self) -> bytearray:
        """This sequence's cells as llama.cpp writes them (for `restore_state`)."""
        size = int(lc.llama_state_seq_get_size_ext(self.ctx, self.seq, 0))
        data = bytearray(size)
        buf = (ctypes.c_uint8 * size).from_buffer(data)
        if lc.llama_state_seq_get_data_ext(self.ctx, buf, size, self.seq, 0) != size:
            raise LocalfabError("llama.cpp could not copy the KV cache's state")
        return data

    def restore_state(self, data: bytearray, tokens: Sequence[int]) -> bool:
        """Make this sequence hold `tokens` again from their saved state; False (and the
        sequence empty) when llama.cpp refuses it (no room, another layout)."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        n = int(lc.llama_state_seq_set_data_ext(self.ctx, buf, len(data), self.seq, 0))
        return self._loaded(tokens if n == len(data) else None)

    def save_file(self, f: BinaryIO) -> int:
        """Write this sequence's tokens and cells to `f` in llama.cpp's sequence state file
        format (llama-server's slot save, see `seq_file`); the bytes written."""
        state = self.save_state()
        head = seq_file.head(self.cached)
        f.write(head)
        f.write(memoryview(state)[seq_file.FRAMING :])
        return len(head) + len(state) - seq_file.FRAMING

    def load_file(self, data: bytearray) -> int:
        """Make this sequence hold what a sequence state file (`data`, read whole) holds; the
        bytes llama.cpp took. `seq_file.BadSeqFile` says why a file is refused, before or after
        llama.cpp looked at its state (a file cut short, another model or layout, no room); the
        sequence is empty then."""
        self._loaded(None)  # what it held goes either way (as llama-server's slot)
        parsed = seq_file.parse_head(data, capacity=self.n_ctx)
        # The state goes to llama.cpp as a buffer, with the framing its buffer reader expects
        # (taken from the empty sequence's own state): that reader never reads past the end.
        framing = self.save_state()[: seq_file.FRAMING]
        state = memoryview(data)[parsed.state_offset :]
        buffer = framing + state
        del state
        view = (ctypes.c_uint8 * len(buffer)).from_buffer(buffer)
        n = int(lc.llama_state_seq_set_data_ext(self.ctx, view, len(buffer), self.seq, 0))
        del view
        if n > seq_file.FRAMING:
            self._loaded(parsed.tokens)
            return parsed.state_offset + n - seq_file.FRAMING
        self._loaded(None)
        missing = seq_file.missing_bytes(memoryview(buffer)[seq_file.FRAMING :])
        if missing > 0:
            raise seq_file.BadSeqFile(
                f"it is cut short: {len(data)} bytes, its layout needs at least {missing} more",
                cut_short=True,
            )
        raise seq_file.BadSeqFile(
            "No available space in KV cache or invalid slot save file (saved with another "
            "model, cache type or context?)"
        )

    def _loaded(self, tokens: Sequence[int] | None) -> bool:
        """After a state was loaded into the sequence: it holds `tokens`, or, when llama.cpp
        refused the state (None), nothing. No logits: the next decode computes them."""
        if tokens is None:
            lc.llama_memory_seq_rm(self.mem, self.seq, -1, -1)
        self.cached[:] = tokens or []
        self._after_cut = (len(self.cached), None)
        return tokens is not None

    def swap_with_cache(self, tokens: Sequence[int]) -> Restored | None:
        """Before `tokens` replace what the sequence holds: keep its state in the prompt cache
        when most of it would go, and restore a kept state (from RAM or disk) that holds more of
        `tokens` (then `reuse_prefix` keeps what they share). What was restored, or None;
        nothing without a prompt cache."""
        cache = self.prompt_cache
        if cache is None or not cache.enabled:
            return None
        t0 = time.perf_counter()
        have = self.common_prefix(tokens)
        if 2 * have < len(self.cached) and cache.worth_keeping(self.cached):
            cache.put(self.cached, self.save_state())
        found = cache.take(tokens, have)
        if found is None:
            return None
        entry, tier = found
        if not self.restore_state(entry.state, entry.tokens):
            cache.refused(entry)
            return None
        n = self.common_prefix(tokens)
        cache.restored(n, tier)
        return Restored(n, time.perf_counter() - t0, tier)

    def persist(self, slack: int = 0) -> int:
        """Write what the sequence holds to the prompt cache's disk tier unless a file holds it
        already, all but its last `slack` tokens at least (a chat going idle, the app
        quitting, `run` ending); the bytes written."""
        cache = self.prompt_cache
        if cache is None or cache.on_disk(self.cached, slack):
            return 0
        return cache.store(self.cached, self.save_state(), new=True)

    def clear(self) -> None:
        self._wipe()
        self.cached.clear()
        self._after_cut = (0, None)

    def _wipe(self) -> None:
        """Remove every cell of this sequence (of the whole cache when it is the only one)."""
        if self.shared:
            lc.llama_memory_seq_rm(self.mem, self.seq, -1, -1)
        else:
            lc.llama_memory_clear(self.mem, True)

    def copy_from(self, other: KVCache) -> None:
        """Make this sequence hold what `other` holds (its cells copied, nothing evaluated)."""
        lc.llama_memory_seq_rm(self.mem, self.seq, -1, -1)
        lc.llama_memory_seq_cp(self.mem, other.seq, self.seq, -1, -1)
        self.cached[:] = other.cached
        self._after_cut = (len(self.cached), None)

    def drop_span(self, start: int, end: int) -> None:
        """Remove cached tokens [start, end) and slide the later ones back, without re-processing.

        This is the context shift: RoPE positions of the kept cells are moved by llama.cpp
        (`llama_memory_seq_add`). Raises if the model's cache cannot shift.
        """
        if not 0 <= start <= end <= len(self.cached):
            raise ValueError(
                f"span [{start}, {end}) is outside the cache of {len(self.cached)} tokens"
            )
        start, end = image_start(self.cached, start), image_end(self.cached, end)  # images whole
        if start == end:
            return
        if not self.can_shift:
            raise LocalfabError("this model's KV cache cannot be shifted")
        n_past = len(self.cached)
        if not lc.llama_memory_seq_rm(self.mem, self.seq, start, end):
            raise LocalfabError("llama.cpp could not remove KV cells for the shift")
        lc.llama_memory_seq_add(self.mem, self.seq, end, n_past, -(end - start))
        del self.cached[start:end]

    def _best_span_end(self, a: int, rest: Sequence[int]) -> tuple[int, int]:
        """Where in the cache (after `a`) `rest` starts again, and how long it matches there."""
        cached = self.cached
        k = min(_SHIFT_KEY, len(rest))
        key = tuple(rest[:k])
        best_b, best_len = 0, 0
        for b in range(a + 1, len(cached) - k + 1):
            if tuple(cached[b : b + k]) != key:
                continue
            m = k
            limit = min(len(cached) - b, len(rest))
            while m < limit and cached[b + m] == rest[m]:
                m += 1
            if m > best_len:
                best_b, best_len = b, m
        return best_b, best_len

    def align_to(self, target: Sequence[int]) -> tuple[int, int]:
        """Shift the cache so it shares the longest prefix with `target`; no token is evaluated.

        The cache holds [common prefix][span that target no longer has][part target keeps...].
        The span is found by matching where target's continuation after the common prefix
        starts again in the cache; its cells are removed and the later ones moved back.
        Returns (start, end) of the removed span, (0, 0) when nothing was removed.
        """
        a = self.common_prefix(target)
        if a >= len(target) or a >= len(self.cached) or not self.can_shift:
            return (0, 0)
        best_b, best_len = self._best_span_end(a, target[a:])
        if best_len < _MIN_SHIFT_KEEP:
            return (0, 0)
        self.drop_span(a, best_b)
        return (a, best_b)

    def rebase(self, target: Sequence[int]) -> None:
        """Make the cache hold exactly `target`: shift what can be kept, evaluate the rest."""
        self.align_to(target)
        lcp = self.reuse_prefix(target, need_logits=False)
        if lcp < len(target):
            self.decode(list(target[lcp:]), lcp, logits_last=False)
