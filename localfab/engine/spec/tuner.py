"""How long a draft pays: measured costs of a verify (`SpecCosts`), acceptance and the draft
length that gives the most tokens per second (`Tuner`), and the draft to verify (`propose`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from localfab.engine.spec.drafters import Drafter


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
