"""The checks of what a client sends that need the model: prompt tokens and logit biases
(in the vocabulary, the prompt within the window). One vocabulary test for all of them,
`engine.types.outside_vocab`, the engine's own."""

from __future__ import annotations

from collections.abc import Sequence

from localfab.engine.types import SamplingParams, outside_vocab, vocab_message
from localfab.server.errors import ApiError


def check_prompt(tokens: Sequence[int], n_vocab: int, n_ctx: int, *, images: bool = False) -> None:
    """A prompt's tokens are in the vocabulary (or, with `images`, an image's ids that a
    request's image gave it) and leave room in the window for a token."""
    if outside_vocab([t for t in tokens if t >= 0] if images else tokens, n_vocab) is not None:
        raise ApiError("Prompt contains invalid tokens")
    if tokens and len(tokens) >= n_ctx:
        raise ApiError.exceed_context(len(tokens), n_ctx)


def check_bias(sampling: SamplingParams, n_vocab: int) -> None:
    """Every token a logit_bias names is in the vocabulary."""
    bad = outside_vocab((tok for tok, _ in sampling.logit_bias), n_vocab)
    if bad is not None:
        raise ApiError(f"Field 'logit_bias': {vocab_message(bad, n_vocab)}")


def check_tokens(tokens: Sequence[object], n_vocab: int) -> None:
    """Token ids given by a client (/detokenize, /tokenize's pieces) are in the vocabulary."""
    bad = outside_vocab(tokens, n_vocab)
    if bad is None:
        return
    if isinstance(bad, bool) or not isinstance(bad, int):
        raise ApiError("'tokens' must be an array of token ids")
    raise ApiError(vocab_message(bad, n_vocab))
