"""llama.cpp's sampler chain, driven so that a grammar can never make llama.cpp abort.

`llama_sampler_sample` applies every sampler and then accepts the chosen token into each. When
the grammar allows no candidate (`root ::= [\\x00]`: no token's text can match), the grammar
sampler sets every logit to -inf, the chain still picks some token, and accepting it throws
"Unexpected empty grammar stack after accepting piece" inside llama.cpp, which the C API turns
into an abort of the whole process. The same happens when the grammar is complete (only
end-of-generation is allowed) and `ignore_eos` or a logit bias forbids that.

Here the grammar is applied first, on its own, to a candidate array this module owns; the
logit biases are added in numpy; only if some candidate survives are the other samplers applied
and the token accepted. No survivor ends the reply with GrammarDeadEnd instead. Without a grammar
nothing can abort, and the chain (logit biases included) samples straight from the context in C,
as before: building the candidate array in numpy costs about half a millisecond a token on a
262k vocabulary.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp as lc
import numpy as np

from localfab.engine.grammar.limits import GrammarDeadEnd, check_grammar
from localfab.engine.types import SamplingParams
from localfab.errors import LocalfabError, UsageError

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert _TOKEN_DATA.itemsize == ctypes.sizeof(lc.llama_token_data)

# Seed used when a request asks for a random one (-1): llama.cpp's LLAMA_DEFAULT_SEED.
DEFAULT_SEED = 0xFFFFFFFF


def penalty_window(repeat_last_n: int, n_ctx: int) -> int:
    """Tokens the repetition penalties look back over: -1 or anything past n_ctx is n_ctx.

    llama.cpp allocates a ring buffer of this many tokens and scans it for every candidate, so
    an unclamped 2**31 costs 8 GiB and seconds per token.
    """
    if repeat_last_n < 0 or repeat_last_n > n_ctx:
        return n_ctx
    return repeat_last_n


def is_fast_greedy(p: SamplingParams) -> bool:
    """Whether `p` is plain greedy decoding, which needs only the arg-max of the logits.

    numpy finds that in a fraction of the time the C sampler spends building its 262k-entry
    candidate list, so the engine then samples without a sampler chain.
    """
    return (
        p.temperature <= 0
        and not p.grammar
        and not p.logit_bias
        and p.repeat_penalty == 1.0
        and not p.frequency_penalty
        and not p.presence_penalty
    )


def _grammar_sampler(vocab: ctypes.c_void_p, grammar: str, triggers: tuple[str, ...]) -> Any:
    """llama.cpp's grammar sampler; lazy (waiting for one of `triggers`) where there are any."""
    if not triggers:
        return lc.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    patterns = (ctypes.c_char_p * len(triggers))(*(t.encode() for t in triggers))
    return lc.llama_sampler_init_grammar_lazy_patterns(
        vocab, grammar.encode(), b"root", patterns, len(triggers), None, 0
    )


class GuardedSampler:
    """One generation's samplers: grammar (separate), logit biases (numpy), then the chain."""

    def __init__(
        self,
        vocab: ctypes.c_void_p,
        n_vocab: int,
        n_ctx: int,
        params: SamplingParams,
        bias: dict[int, float],
        ctx: ctypes.c_void_p | None = None,
    ) -> None:
        self._vocab = vocab
        self._ctx = ctx
        self.n_vocab = n_vocab
        self.grammar: ctypes.c_void_p | None = None
        self.chain: ctypes.c_void_p | None = None
        if params.grammar:
            check_grammar(params.grammar)
            grammar = _grammar_sampler(vocab, params.grammar, params.grammar_triggers)
            if not grammar:
                raise UsageError(
                    "the grammar could not be parsed: check its GBNF syntax and that it "
                    "defines `root` (llama.cpp's log names the error)"
                )
            self.grammar = grammar
        # Nothing to guard without a grammar: the biases go into the chain and
        # llama_sampler_sample applies and accepts it in one C call, as before. A lazy grammar
        # samples that way too until it starts: each token is checked against it alone, and
        # the first one it refuses hands sampling to the guarded path for good (which adds the
        # biases again: only bans, -inf either way, allow this).
        self._lazy = bool(params.grammar_triggers) and all(b == -np.inf for b in bias.values())
        self._native = ctx is not None and (self.grammar is None or self._lazy)
        try:
            self.chain = self._build_chain(params, n_ctx, bias if self._native else {})
        except BaseException:
            self.close()
            raise
        self._bias_ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
        self._bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._cand = np.empty(n_vocab, dtype=_TOKEN_DATA)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._kept = 0  # candidates the chain kept at the last `sample` (not the native path)

    def _build_chain(
        self, p: SamplingParams, n_ctx: int, bias: dict[int, float]
    ) -> ctypes.c_void_p:
        chain: ctypes.c_void_p = lc.llama_sampler_chain_init(
            lc.llama_sampler_chain_default_params()
        )
        add = lc.llama_sampler_chain_add
        if bias:
            biases = (lc.llama_logit_bias * len(bias))(
                *(lc.llama_logit_bias(token=t, bias=b) for t, b in bias.items())
            )
            add(chain, lc.llama_sampler_init_logit_bias(self.n_vocab, len(bias), biases))
        if p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            add(
                chain,
                lc.llama_sampler_init_penalties(
                    self.n_vocab,
                    penalty_window(p.repeat_last_n, n_ctx),
                    p.repeat_penalty,
                    p.frequency_penalty,
                    p.presence_penalty,
                ),
            )
        if p.temperature <= 0:
            add(chain, lc.llama_sampler_init_greedy())
            return chain
        if p.top_k > 0:
            add(chain, lc.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            add(chain, lc.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            add(chain, lc.llama_sampler_init_min_p(p.min_p, 1))
        add(chain, lc.llama_sampler_init_temp(p.temperature))
        seed = DEFAULT_SEED if p.seed is None or p.seed < 0 else p.seed & 0xFFFFFFFF
        add(chain, lc.llama_sampler_init_dist(seed))
        return chain

    def sample(self, logits: np.ndarray) -> int:
        """Pick the next token from `logits` (not modified); GrammarDeadEnd if none is allowed.

        When the grammar is complete and only end-of-generation may follow, that token is
        returned even if ignore_eos or a bias forbids it: the reply cannot go on.
        """
        if self._native:
            return int(lc.llama_sampler_sample(self.chain, self._ctx, -1))
        cand = self._cand
        cand["id"] = self._ids
        cand["logit"] = logits[: self.n_vocab]
        cand["p"] = 0.0
        arr = lc.llama_token_data_array(
            data=cand.ctypes.data_as(lc.llama_token_data_p),
            size=self.n_vocab,
            selected=-1,
            sorted=False,
        )
        grammar_ok: np.ndarray | None = None
        if self.grammar is not None:
            # The grammar sampler only masks (logit = -inf); it keeps the order and the size.
            lc.llama_sampler_apply(self.grammar, ctypes.byref(arr))
            grammar_ok = cand["logit"] > -np.inf
            if not grammar_ok.any():
                raise GrammarDeadEnd(
                    "the grammar allows no token here: no token of the model's vocabulary can "
                    "continue it; check that the grammar can match ordinary text"
                )
        if self._bias_ids.size:
            cand["logit"][self._bias_ids] += self._bias_values
        allowed = cand["logit"] > -np.inf
        if not allowed.any():
            if grammar_ok is not None:
                left = np.flatnonzero(grammar_ok)
                if left.size <= 64 and all(
                    lc.llama_vocab_is_eog(self._vocab, int(t)) for t in left
                ):
                    return int(left[0])  # the grammar is complete: the reply ends here
                raise GrammarDeadEnd(
                    "logit_bias forbids every token the grammar allows here; "
                    "remove the bias on those tokens"
                )
            raise GrammarDeadEnd("logit_bias forbids every token; remove some of the bans")
        assert self.chain is not None
        lc.llama_sampler_apply(self.chain, ctypes.byref(arr))
        self._kept = int(arr.size)
        if not 0 <= arr.selected < arr.size:
            raise LocalfabError("the sampler chose no token")
        tok = int(arr.data[arr.selected].id)
        if not allowed[tok]:
            raise LocalfabError(f"the sampler chose token {tok}, which the grammar forbids")
        return tok

    def kept(self, n: int, token: int) -> tuple[np.ndarray, np.ndarray, float]:
        """The candidates the chain kept at the last `sample`, as llama-server's
        post_sampling_probs reads them: the `n` most probable (ids, probabilities), and the
        probability of `token` (0 if the chain dropped it). Needs a sampler built with
        `ctx=None`: the chain then runs on this sampler's own candidate array, read back here.

        A chain that picks without drawing (greedy) leaves no probabilities: those are then the
        softmax of the logits it kept.
        """
        if self._native:
            raise LocalfabError("post-sampling probabilities need a sampler built with ctx=None")
        view = self._cand[: self._kept]
        p = view["p"].astype(np.float64)
        if not p.any():
            logits = view["logit"].astype(np.float64)
            finite = np.isfinite(logits)
            if finite.any():
                e = np.exp(logits[finite] - logits[finite].max())
                p[finite] = e / e.sum()
        n = min(n, p.size)
        best = np.argpartition(-p, n - 1)[:n] if 0 < n < p.size else np.arange(n)
        best = best[np.argsort(-p[best], kind="stable")]
        ids = view["id"]
        at = np.flatnonzero(ids == token)
        return ids[best], p[best], float(p[at[0]]) if at.size else 0.0

    def sample_at(self, logits: np.ndarray, index: int) -> int:
        """Like `sample`, for output `index` of the last batch (`logits` are that row)."""
        if self._native:
            tok = int(lc.llama_sampler_sample(self.chain, self._ctx, index))
            if self.grammar is None or self.allows(tok):
                return tok
            # The lazy grammar has started and refuses the chain's pick (which the chain has
            # taken in: penalties see one token that was not kept): from now on the grammar
            # goes first.
            self._native = False
        return self.sample(logits)

    def allows(self, tok: int) -> bool:
        """Whether the grammar lets `tok` come next (a waiting lazy grammar lets any)."""
        one = self._one
        one["id"] = tok
        one["logit"] = 0.0
        arr = lc.llama_token_data_array(
            data=one.ctypes.data_as(lc.llama_token_data_p), size=1, selected=-1, sorted=False
        )
        lc.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        return bool(one["logit"][0] > -np.inf)

    def accept(self, token: int, *, grammar: bool = True) -> None:
        """Record `token` as chosen (grammar state, repetition penalties); with `grammar`
        False the grammar does not see it (a lazy one inside a reasoning block)."""
        if self.grammar is not None and grammar:
            lc.llama_sampler_accept(self.grammar, token)
        if self.chain is not None and not self._native:  # the native path accepted it
            lc.llama_sampler_accept(self.chain, token)

    def accept_forced(self, token: int) -> None:
        """Record a token chosen without sampling (the reasoning budget's closing tag): the
        chain's penalties see it too (there is no grammar then, see `reply.new_thought`)."""
        if self.chain is not None:
            lc.llama_sampler_accept(self.chain, token)

    def close(self) -> None:
        for attr in ("grammar", "chain"):
            smpl = getattr(self, attr)
            if smpl is not None:
                lc.llama_sampler_free(smpl)
                setattr(self, attr, None)
