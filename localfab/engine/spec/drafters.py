"""Where drafts come from: n-grams of the history (`NgramDraft`) or a small draft model
(`ModelDraft`)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from localfab.engine.kvcache import KVCache

if TYPE_CHECKING:
    from localfab.engine.handle import Handle

# N-gram lengths the lookup tries, longest first.
NGRAM_SIZES = (4, 3, 2)


class Drafter(Protocol):
    """Proposes the tokens likely to follow the history (prompt and reply so far)."""

    #: Whether a one-token guess is free, so acceptance can be watched while not drafting.
    cheap: bool
    #: After `draft`: for how many tokens before the lookup point the history agrees with the
    #: text the draft was copied from (0 where drafts are not copies).
    agreement: int

    def reset(self, tokens: Sequence[int]) -> None: ...

    def push(self, token: int) -> None: ...

    def rebase(self, tokens: Sequence[int]) -> None: ...

    def draft(self, n: int) -> list[int]: ...


class NgramDraft:
    """Prompt lookup: the tokens that followed an earlier occurrence of the last n-gram.

    For every n in `NGRAM_SIZES` a dict maps each n-gram of the history to where its followers
    start, in order; it is updated as tokens arrive, so a lookup is a few dict reads.

    Of several occurrences the lookup takes the first one at or after the place in the history
    that the reply was last seen copying (`copy_at`), else the latest. A reply that rewrites a
    text leaves parts out: after a cut, the short n-gram that picks the copy up again (". In")
    also occurs in places already copied, or later in the reply itself, while the text goes on
    from the first occurrence past the cut.
    """

    cheap = True

    def __init__(self, sizes: Sequence[int] = NGRAM_SIZES) -> None:
        self.sizes = tuple(sizes)
        self.tokens: list[int] = []
        self.maps: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.sizes}
        self.agreement = 0
        #: Where the text the last draft was copied from goes on, moved on by every token
        #: that follows it (-1: nothing drafted yet).
        self.copy_at = -1

    def reset(self, tokens: Sequence[int]) -> None:
        self.tokens = []
        self.copy_at = -1
        for m in self.maps.values():
            m.clear()
        for tok in tokens:
            self.push(tok)

    def push(self, token: int) -> None:
        toks = self.tokens
        at = self.copy_at
        if 0 <= at < len(toks) and toks[at] == token:
            self.copy_at = at + 1
        toks.append(token)
        end = len(toks) - 1  # the new token follows the n-gram that ends just before it
        for n, m in self.maps.items():
            if end >= n:
                key = tuple(toks[end - n : end])
                found = m.get(key)
                if found is None:
                    m[key] = [end]
                else:
                    found.append(end)

    def rebase(self, tokens: Sequence[int]) -> None:
        """The window moved: lookups keep using the whole history, which is still text."""

    def draft(self, n: int) -> list[int]:
        """Up to `n` tokens; `agreement` then says how far back (up to `n`) the history
        matches the text before them."""
        toks = self.tokens
        size = len(toks)
        self.agreement = 0
        for k, m in self.maps.items():
            if size < k:
                continue
            found = m.get(tuple(toks[size - k :]))
            if found is not None:
                i = bisect.bisect_left(found, self.copy_at) if self.copy_at >= 0 else len(found)
                at = found[i] if i < len(found) else found[-1]
                agree = k
                while agree < min(n, at) and toks[at - 1 - agree] == toks[size - 1 - agree]:
                    agree += 1
                self.agreement = agree
                self.copy_at = at
                out = toks[at : at + n]
                # The text runs into the history's end (a repeating loop): it goes on as it did.
                period = size - at
                while len(out) < n:
                    out.append(out[len(out) - period])
                # Never an image's ids (`image_ids`): they are not tokens to decode.
                return list(itertools.takewhile(lambda t: t >= 0, out))
        return []


class ModelDraft:
    """A small model of the same vocabulary drafting greedily in its own context.

    Its cache follows the model's: before each draft it is shifted as the model's was
    (`KVCache.align_to`), reuses the common prefix and evaluates only what it lacks, so it stays
    in sync across turns and context shifts.
    """

    cheap = False
    agreement = 0

    def __init__(self, engine: Handle, p_min: float, kv: KVCache | None = None) -> None:
        """Drafts with `engine` in `kv` (default: its own sequence; a server slot passes the
        draft context's sequence of the same number)."""
        self.engine = engine
        self.kv: KVCache = engine.kv if kv is None else kv
        self.p_min = p_min
        self.tokens: list[int] = []
        self._new_prompt = False

    def reset(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)
        self._new_prompt = True

    def push(self, token: int) -> None:
        self.tokens.append(token)

    def rebase(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)

    def _sync(self) -> None:
        kv, toks = self.kv, self.tokens
        if len(toks) > kv.n_ctx:
            del toks[: len(toks) - kv.n_ctx]
        if self._new_prompt:  # once per reply: another conversation's state kept or restored
            self._new_prompt = False
            kv.swap_with_cache(toks)
        kv.align_to(toks)
        n = kv.reuse_prefix(toks)
        kv.decode(toks[n:], n, logits_last=True)

    def draft(self, n: int) -> list[int]:
        kv = self.kv
        n = min(n, kv.n_ctx - len(self.tokens))
        if n <= 0 or min(self.tokens, default=0) < 0:  # a draft model reads no images
            return []
        self._sync()
        out: list[int] = []
        p_min = self.p_min
        while True:
            logits = kv.logits()
            tok = int(logits.argmax())
            if p_min > 0.0:
                peak = float(logits[tok])
                p = 1.0 / float(np.exp(logits - peak, dtype=np.float32).sum())
                if p < p_min:
                    break
            out.append(tok)
            if len(out) >= n:
                break
            kv.decode_one(tok)
        return out
