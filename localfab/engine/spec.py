"""Speculative decoding: draft a few tokens cheaply, verify them in one decode of the model.

Drafts come from n-grams of the prompt and the reply so far (`NgramDraft`, llama.cpp's
"ngram-simple") or from a small draft model of the same vocabulary (`ModelDraft`,
"draft-simple"). The model evaluates the pending token and the draft in one batch with logits
for every position; at each position it samples with its own sampler chain, exactly as without
speculation, and a drafted token is kept only when it equals that sample. The first mismatch
ends the run with the model's own token, and the cells of the tokens not kept leave the KV
cache. So the text is the same as without speculation at temperature 0 and the distribution
the same at any temperature; stop strings, grammar, biases, cancel, max_tokens and a full
window are handled token by token as in the plain loop.

Plain decoding must be matched bit for bit, or a near tie between two tokens could be broken
the other way. llama.cpp computes a batch with other CPU kernels than one token in three cases:
repacked weights from 4 tokens on, its tiled K-quant kernels from 8 tokens on, and flash
attention over an f16 or f32 cache, which for one token is split over the threads once the
cache spans 512 padded cells (past 256 tokens): V is summed in f16 in both, but over other
ranges, so the roundings differ. That last one is not small: on the test model past 256 tokens
a verified position's logits differ from one-token decoding by up to 0.9 (margins between the
two likeliest tokens move by as much), as with llama-server's own speculation. So exact
speculation on the CPU loads the model with `EngineSettings.batch_invariant` (no repacked
weights, no tiled kernels) and a q8_0 K cache (`SpecSettings.load_settings`; `run`, `serve`
and the chat app do), where one token and a batch of up to 63 take the same kernels at any length,
and a verify holds no more tokens than `exactness.exact_batch` measures (a whole draft there; 3
with repacked weights, 1 past 256 tokens of an f16 cache, where speculation then stays off).
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import llama_cpp as lc
import numpy as np

from localfab.engine.exactness import PROBE_MAX
from localfab.engine.generation import _argmax_without, _make_room, _probs, rank
from localfab.engine.kvcache import KVCache
from localfab.engine.sampling import GuardedSampler
from localfab.engine.text import StopMatcher, Utf8Stream
from localfab.engine.types import (
    ONE_THREAD_CELLS,
    FinishReason,
    GenerationOptions,
    SpecSettings,
    StopType,
    TokenEvent,
)

if TYPE_CHECKING:
    from localfab.engine.llama import Engine

log = logging.getLogger("localfab.engine")

Logits = np.ndarray[Any, np.dtype[np.float32]]

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
                return out
        return []


class ModelDraft:
    """A small model of the same vocabulary drafting greedily in its own context.

    Its cache follows the model's: before each draft it is shifted as the model's was
    (`KVCache.align_to`), reuses the common prefix and evaluates only what it lacks, so it stays
    in sync across turns and context shifts.
    """

    cheap = False
    agreement = 0

    def __init__(self, engine: Engine, p_min: float, kv: KVCache | None = None) -> None:
        """Drafts with `engine` in `kv` (default: its own sequence; a server slot passes the
        draft context's sequence of the same number)."""
        self.engine = engine
        self.kv: KVCache = engine._kv if kv is None else kv
        self.p_min = p_min
        self.tokens: list[int] = []

    def reset(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)

    def push(self, token: int) -> None:
        self.tokens.append(token)

    def rebase(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)

    def _sync(self) -> None:
        kv, toks = self.kv, self.tokens
        if len(toks) > kv.n_ctx:
            del toks[: len(toks) - kv.n_ctx]
        kv.align_to(toks)
        n = kv.reuse_prefix(toks)
        kv.decode(toks[n:], n, logits_last=True)

    def draft(self, n: int) -> list[int]:
        kv = self.kv
        n = min(n, kv.n_ctx - len(self.tokens))
        if n <= 0:
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


@dataclass
class SpecCosts:
    """What a decode costs on this machine, kept by the engine across replies (seconds).

    A verify of k drafted tokens costs about `base + k * per_draft`: a line fitted by least
    squares over recent verifies, each weighing `_FIT_KEEP` times as much as the next one. A
    batch of two or three tokens costs much more per token than a long one (a short draft
    nearly doubles a decode where a long one adds a sixth per token), so one cost per drafted
    token, measured after short drafts, would keep drafts short for good. Until verifies of
    different lengths are seen, `base` is one decode and `per_draft` what each drafted token
    added to it.
    """

    one: float = 0.0  # one token
    per_draft: float = 0.0  # what a verify adds per drafted token
    base: float = 0.0  # a verify's cost before its drafted tokens (0: as one token)
    _fit: list[float] = field(default_factory=lambda: [0.0] * 5, repr=False)

    def verify(self, n_draft: int) -> float:
        """What a verify of `n_draft` drafted tokens is expected to take."""
        return (self.base or self.one) + n_draft * self.per_draft

    def took_one(self, seconds: float) -> None:
        """A plain decode took `seconds`."""
        self.one = seconds if self.one <= 0.0 else self.one + _EMA * (seconds - self.one)

    def took_verify(self, seconds: float, n_draft: int) -> None:
        """A decode that verified `n_draft` drafted tokens took `seconds` (drafting included)."""
        fit = self._fit
        for i, v in enumerate((1.0, n_draft, seconds, n_draft * n_draft, n_draft * seconds)):
            fit[i] = fit[i] * _FIT_KEEP + v
        w, sk, sy, skk, sky = fit
        spread = skk * w - sk * sk  # weighted variance of the lengths, times w squared
        if spread >= w * w:  # lengths at least a token apart: fit the line
            per = (sky * w - sk * sy) / spread
            base = (sy - per * sk) / w
            if per > 0.0 and base > 0.0:
                self.per_draft, self.base = per, base
                return
        if self.one > 0.0:
            per = max(0.0, seconds - self.verify(0)) / n_draft
            self.per_draft = (
                per if self.per_draft <= 0.0 else self.per_draft + _EMA * (per - self.per_draft)
            )


_EMA = 0.2  # weight of the newest measurement
_FIT_KEEP = 0.85  # weight of a verify in the cost line against the next one
_PRIOR = 0.6  # acceptance assumed before any is measured
_PROBE_EVERY = 32  # plain tokens before a draft model that did not pay is tried again
_PROBE_ACCEPT = 0.8  # guesses this often right make a stale cost worth measuring again
_PROBE_LEN = 3  # tokens in a draft that measures the cost again (a verify of four rows)


@dataclass
class Tuner:
    """Draft length from measured acceptance and cost; zero while speculation does not pay.

    `accept` is the chance that a drafted token is kept (an average over recent drafts and,
    while not drafting, over free one-token guesses). A draft of k tokens is expected to
    yield (1 - a^(k+1)) / (1 - a) tokens for the cost of one decode plus k drafted tokens;
    the chosen k is the one with the most tokens per second, 0 (plain decoding) included.
    """

    costs: SpecCosts
    adaptive: bool = True
    k_max: int = 16
    cheap: bool = True  # free one-token guesses keep `accept` current while not drafting
    accept: float = _PRIOR
    _best: int = field(default=-1, repr=False)
    _idle: int = field(default=0, repr=False)

    def length(self, limit: int) -> int:
        """How many tokens to draft now, at most `limit`."""
        if not self.adaptive:
            return limit
        if self._best < 0:
            self._best = self._choose()
        return min(self._best, limit)

    def _choose(self) -> int:
        costs = self.costs
        if costs.one <= 0.0:
            return self.k_max  # not measured yet: try, and measure
        a = min(self.accept, 0.999)
        best_k, best_rate = 0, 1.0 / costs.one
        for k in range(1, self.k_max + 1):
            if fill_tiles(k, k) != k:
                continue  # a verify that costs as much as a longer one (see `fill_tiles`)
            rate = (1.0 - a ** (k + 1)) / (1.0 - a) / costs.verify(k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0 and self.cheap and a >= _PROBE_ACCEPT and self._idle >= _PROBE_EVERY:
            # The guesses say drafts would mostly be kept, but the costs say they do not pay:
            # the cost may have been measured in a busy moment and is only measured again by a
            # verify. One short draft measures it again.
            self._idle = 0
            return min(_PROBE_LEN, self.k_max)
        return best_k

    def plain(self, seconds: float) -> None:
        """A plain decode (no draft) took `seconds`."""
        self.costs.took_one(seconds)
        self.idle()

    def idle(self) -> None:
        """A token was decoded without a draft."""
        self._best = -1
        self._idle += 1
        if not self.cheap and self._idle >= _PROBE_EVERY:
            # Without free guesses, try drafting again now and then.
            self._idle = 0
            self.accept = max(self.accept, _PRIOR)

    def verify(self, n_draft: int, n_kept: int, seconds: float) -> None:
        """A verify of `n_draft` tokens kept `n_kept` and took `seconds`."""
        self.costs.took_verify(seconds, n_draft)
        self.accepted(n_draft, n_kept)

    def accepted(self, n_draft: int, n_kept: int) -> None:
        """A verify of `n_draft` drafted tokens kept `n_kept` of them."""
        # A run that ends early says the next token is where drafts go wrong: one weight per
        # drafted token seen, the rejected one included.
        seen = min(n_kept + 1, n_draft)
        self.accept += (1.0 - (1.0 - _EMA) ** seen) * (n_kept / seen - self.accept)
        self._best = -1
        self._idle = 0

    def guess(self, right: bool) -> None:
        """A free one-token guess made while not drafting was right or wrong."""
        self.accept += _EMA * ((1.0 if right else 0.0) - self.accept)
        self._best = -1


# A prompt lookup's draft holds at least this many tokens when the tuner asks for as many.
_COPY_MIN = 4

# llama.cpp's CPU matrix kernels take the rows of a batch four at a time (tinyBLAS's 4x4 tiles,
# the repacked weights' four-row kernels): a batch of 4n + 1 to 4n + 3 rows makes one more pass
# over every weight matrix for the rest, the output matrix included (with a 262k-token
# vocabulary most of a small model). A verify of the pending token and k drafted tokens is k + 1
# rows; on 2 CPU cores with the test model 8 rows took 45 ms, 7 rows 66 and 9 rows 60; 48 rows
# 165 ms, 49 rows 194.
VERIFY_ROWS = 4


def fill_tiles(k: int, available: int) -> int:
    """The draft length to verify in place of `k` when `available` tokens are drafted.

    From a tile up, a verify fills whole tiles: the draft grows to the next whole number of
    tiles where the drafter has the tokens (they cost nothing more), else it shrinks to the
    last one. Below a tile it stays as it is.
    """
    rows = k + 1
    if rows < VERIFY_ROWS:
        return min(k, available)
    up = -(-rows // VERIFY_ROWS) * VERIFY_ROWS - 1
    return up if up <= available else rows // VERIFY_ROWS * VERIFY_ROWS - 1


def propose(tuner: Tuner, drafter: Drafter, limit: int) -> list[int]:
    """The draft to verify now, at most `limit` tokens; [] to decode one token plainly.

    The tuner says whether a draft pays now and, for a draft model, how long it should be. A
    prompt lookup's drafts copy a text, and a copy that has held for the last n tokens tends to
    hold about n more (replies that rewrite an input part from it at the edits): its draft is
    as long as the history agrees with the source (`Drafter.agreement`), from `_COPY_MIN`
    tokens (fewer when the tuner asks for fewer). Long drafts where the copy is sure and short
    ones after each edit cost fewer verifies and fewer rejected tokens than one length for all.
    An adaptive draft then fills whole tiles of the matrix kernels (`fill_tiles`).
    """
    k = tuner.length(limit)
    if k <= 0:
        return []
    if not tuner.adaptive:
        return drafter.draft(k)
    if not drafter.cheap:
        drafts = drafter.draft(k)
        return drafts[: fill_tiles(len(drafts), len(drafts))]
    drafts = drafter.draft(limit)
    return drafts[: fill_tiles(max(min(k, _COPY_MIN), drafter.agreement), len(drafts))]


class _Reply:
    """The tokens of one reply as the plain loop handles them, one position at a time."""

    def __init__(
        self,
        engine: Engine,
        sampler: GuardedSampler | None,
        opts: GenerationOptions,
        utf8: Utf8Stream,
        stops: StopMatcher,
    ) -> None:
        self.vocab = engine._vocab
        self.token_bytes = engine.token_bytes
        self.sampler = sampler
        self.opts = opts
        self.utf8 = utf8
        self.stops = stops
        self.generated: list[int] = []
        self.parts: list[str] = []
        self.finish: FinishReason = "length"
        self.stop_type: StopType = "limit"
        self.t_first = 0.0
        self.draft_n = 0
        self.draft_n_accepted = 0
        self.draft_verifies = 0
        self.eog: np.ndarray[Any, np.dtype[Any]] | None = None
        if sampler is None and opts.sampling.ignore_eos:
            self.eog = np.array(engine.eog_tokens())

    def pick(self, logits: Logits, index: int) -> int:
        sampler = self.sampler
        if sampler is not None:
            return sampler.sample_at(logits, index)
        tok = int(logits.argmax())
        if self.eog is not None and tok in self.eog:
            tok = _argmax_without(logits, self.eog)
        return tok

    def step(self, logits: Logits, index: int) -> TokenEvent | None:
        """Sample at one position and take the token; None when it ends the reply (eos)."""
        n_probs = self.opts.n_probs
        ranked = rank(logits, n_probs, self.token_bytes) if n_probs > 0 else None
        tok = self.pick(logits, index)
        generated = self.generated
        if not generated:
            self.t_first = time.perf_counter()
        if lc.llama_vocab_is_eog(self.vocab, tok):
            self.finish, self.stop_type = "stop", "eos"
            return None
        if self.sampler is not None:
            self.sampler.accept(tok)
        generated.append(tok)
        piece = self.token_bytes(tok)
        text = self.stops.feed(self.utf8.feed(piece))
        if text:
            self.parts.append(text)
        probs = None if ranked is None else _probs(ranked, piece, logits, tok)
        return TokenEvent(tok, text, probs)

    def ended(self) -> bool:
        """After a token was yielded: whether a stop string, a cancel or max_tokens ends it."""
        if self.stops.matched is not None:
            self.finish, self.stop_type = "stop", "word"
            return True
        cancel = self.opts.cancel
        if cancel is not None and cancel.is_set():
            self.finish, self.stop_type = "cancelled", "cancel"
            return True
        return len(self.generated) == self.opts.max_tokens


class Speculator:
    """The speculative token loop of an engine (one per engine; see `Engine.set_speculation`).

    `max_batch` caps a verify (the pending token and the draft) at the size `exact_batch`
    found to give the logits of plain decoding, `max_batch_past` one that goes past
    `ONE_THREAD_CELLS` of cache (`limit`).
    """

    def __init__(
        self,
        settings: SpecSettings,
        draft: Engine | None = None,
        max_batch: int = PROBE_MAX,
        max_batch_past: int | None = None,
    ) -> None:
        self.settings = settings
        self.draft_engine = draft
        self.max_batch = max_batch
        self.max_batch_past = max_batch if max_batch_past is None else max_batch_past
        self.costs = SpecCosts()
        self.drafter: Drafter = (
            ModelDraft(draft, settings.draft_p_min) if draft is not None else NgramDraft()
        )

    def limit(self, n_cached: int) -> int:
        """The most tokens a verify after `n_cached` cells may hold."""
        within = min(self.max_batch, ONE_THREAD_CELLS - n_cached)
        return max(self.max_batch_past, within)

    def close(self) -> None:
        if self.draft_engine is not None:
            self.draft_engine.close()
            self.draft_engine = None

    def stream(
        self,
        engine: Engine,
        sampler: GuardedSampler | None,
        prompt: Sequence[int],
        opts: GenerationOptions,
        utf8: Utf8Stream,
        stops: StopMatcher,
    ) -> Generator[TokenEvent, None, _Reply]:
        """Generate after `prompt` (already in the cache): the events, then how it ended."""
        reply = _Reply(engine, sampler, opts, utf8, stops)
        yield from self._run(engine._kv, reply, prompt)
        return reply

    def _run(
        self, kv: KVCache, reply: _Reply, prompt: Sequence[int]
    ) -> Generator[TokenEvent, None, None]:
        s = self.settings
        drafter = self.drafter
        drafter.reset(prompt)
        tuner = Tuner(self.costs, adaptive=s.adaptive, k_max=s.max_draft, cheap=drafter.cheap)
        event = reply.step(kv.logits(), -1)
        stop = event is None
        if event is not None:
            yield event
            stop = reply.ended()
        generated = reply.generated
        cached = kv.cached
        n_ctx = kv.n_ctx
        opts = reply.opts
        max_tokens = opts.max_tokens
        n_pushed = 0
        while not stop:
            for tok in generated[n_pushed:]:
                drafter.push(tok)
            n_pushed = len(generated)
            pending = generated[-1]
            if len(cached) >= n_ctx:
                if not _make_room(kv, opts.on_context_full, generated):
                    reply.stop_type = "context"
                    return
                drafter.rebase([*cached, pending])
            room = min(n_ctx - len(cached), self.limit(len(cached))) - 1
            if max_tokens > 0:
                room = min(room, max_tokens - len(generated) - 1)
            t0 = time.perf_counter()
            drafts = propose(tuner, drafter, min(room, s.max_draft))
            if drafts and len(drafts) >= s.draft_min:
                stop = yield from self._verify(kv, reply, tuner, pending, drafts, t0)
                continue
            guess = drafter.draft(1) if drafter.cheap and s.adaptive else []
            t0 = time.perf_counter()
            kv.decode_one(pending)
            tuner.plain(time.perf_counter() - t0)
            event = reply.step(kv.logits(), -1)
            if event is None:
                return
            if guess:
                tuner.guess(guess[0] == event.token)
            yield event
            stop = reply.ended()

    def _verify(
        self,
        kv: KVCache,
        reply: _Reply,
        tuner: Tuner,
        pending: int,
        drafts: list[int],
        t_draft: float,
    ) -> Generator[TokenEvent, None, bool]:
        """One decode of the pending token and the draft; take tokens while they match."""
        n0 = len(kv.cached)
        rows = kv.decode_rows([pending, *drafts], n0)
        seconds = time.perf_counter() - t_draft
        n_draft = len(drafts)
        reply.draft_n += n_draft
        reply.draft_verifies += 1
        i = 0
        kept = 0
        stop = False
        try:
            while True:
                event = reply.step(rows[i], i)
                if event is None:
                    stop = True
                    break
                right = i < n_draft and event.token == drafts[i]
                kept += right
                yield event
                stop = reply.ended()
                if stop or not right:
                    break
                i += 1
        finally:
            # Keep the pending token and the drafted tokens taken before the last position;
            # the token sampled at position i is evaluated by the next step, as in the plain
            # loop. Runs when the consumer closes the stream too.
            kv.truncate(n0 + 1 + i)
        reply.draft_n_accepted += kept
        tuner.verify(n_draft, kept, seconds)
        return stop


def load_draft(path: str, target: Engine, n_gpu_layers: int | None) -> Engine:
    """Load the draft model for `target`; ModelError/UsageError when it cannot draft for it."""
    from localfab.engine.llama import Engine
    from localfab.engine.types import EngineSettings
    from localfab.errors import UsageError
    from localfab.units import format_bytes

    s = target.settings
    settings = EngineSettings(
        # As many sequences as the model (a server's slots each draft in their own).
        n_ctx=target.n_ctx_total,
        n_seq_max=target.n_seq_max,
        kv_unified=s.kv_unified,
        n_gpu_layers=s.n_gpu_layers if n_gpu_layers is None else n_gpu_layers,
        n_threads=target.n_threads,
        n_threads_batch=target.n_threads_batch,
        n_batch=min(s.n_batch, 512),
        n_ubatch=min(s.n_ubatch, 512),
        flash_attn=s.flash_attn,
        swa_full=True,
        warmup=s.warmup,
    )
    draft = Engine(path, settings)
    try:
        check_vocab(draft, target)
        if draft.size > target.size:
            raise UsageError(
                f"the draft model {path} ({format_bytes(draft.size)}) is larger than the "
                f"model ({format_bytes(target.size)}): it would slow decoding down; "
                "pick a smaller draft model"
            )
    except BaseException:
        draft.close()
        raise
    return draft


# llama.cpp's speculative example allows this many extra tokens in one of the vocabularies.
_VOCAB_SLACK = 128


def check_vocab(draft: Engine, target: Engine) -> None:
    """UsageError unless `draft` tokenizes as `target` does (llama.cpp's own checks)."""
    from localfab.errors import UsageError

    where = f"the draft model {draft.path.name} cannot draft for {target.path.name}"
    dv, tv = draft._vocab, target._vocab
    if lc.llama_vocab_type(dv) != lc.llama_vocab_type(tv):
        raise UsageError(f"{where}: its tokenizer is of another kind")
    if abs(draft.n_vocab - target.n_vocab) > _VOCAB_SLACK:
        raise UsageError(
            f"{where}: its vocabulary has {draft.n_vocab} tokens, the model's {target.n_vocab}"
        )
    if draft.bos_token != target.bos_token or draft.eos_token != target.eos_token:
        raise UsageError(f"{where}: its start and end tokens differ")
    n = min(draft.n_vocab, target.n_vocab)
    step = max(1, math.ceil(n / 8192))  # a sample across the whole vocabulary
    for t in range(5, n, step):
        if lc.llama_vocab_get_text(dv, t) != lc.llama_vocab_get_text(tv, t):
            raise UsageError(f"{where}: token {t} differs between the vocabularies")
