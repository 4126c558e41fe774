"""Comparing greedy replies decoded in different batches.

llama.cpp's CPU kernels compute a batch of several sequences slightly differently from a batch
of one, so where the two likeliest tokens are nearly tied a greedy reply decoded beside others
can take the other one (llama-server does the same). A reply decoded together with others
must follow the one decoded alone token for token, and may part from it only at such a tie.
"""

from __future__ import annotations

from typing import Any

# Two likeliest tokens closer than this (in logprob) are a near-tie. Measured on the test model
# with plain greedy decoding (no speculation): replies started a few steps apart, so that one
# reply's tokens shared a batch with another's prompt chunk, parted from their alone text at
# margins of 0.18 and 0.31 on an AVX2 CPU, at points where the model was unsure what follows a
# copied text. On an AVX-512 CPU a batch of 4 or more tokens (repacked weights) moves the top
# logits of one step by up to 0.7 and the margin by up to 0.34 (one argmax flipped in 96
# positions), and four speculating slots, whose own cells were all computed in such batches,
# parted from a reply decoded alone at a margin of 0.79. A reply given another slot's cells or
# logits parts at a clear choice (the median margin is about 6).
NEAR_TIE = 1.0


def assert_follows(alone: dict[str, Any], text: str) -> None:
    """`text` is `alone`'s reply (a /completion answer with n_probs >= 2), or parts from it only
    where alone's two likeliest tokens were a near-tie."""
    prefix = ""
    for k, entry in enumerate(alone["completion_probabilities"]):
        longer = prefix + entry["token"]
        if not text.startswith(longer):
            top = entry["top_logprobs"]
            margin = top[0]["logprob"] - top[1]["logprob"]
            assert margin < NEAR_TIE, (
                f"{text!r} parts from {alone['content']!r} at token {k}, a clear choice "
                f"(margin {margin:.3f})"
            )
            return
        prefix = longer
    assert text == prefix
