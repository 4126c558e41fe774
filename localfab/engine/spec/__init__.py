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

The parts: `drafters` (where drafts come from), `tuner` (how long a draft pays, from measured
costs and acceptance), `loop` (the speculative loop of `Engine.stream`, over the same token
step as every path, `engine.reply.ReplyState`), `exactness` (which verifies match one-token
decoding bit for bit) and `draft_model` (loading and checking a draft model).
"""

from typing import Protocol

from localfab.engine.handle import Handle
from localfab.engine.spec.drafters import NGRAM_SIZES, Drafter, ModelDraft, NgramDraft
from localfab.engine.spec.loop import Speculator
from localfab.engine.spec.tuner import VERIFY_ROWS, SpecCosts, Tuner, fill_tiles, propose


class Speculating(Handle, Protocol):
    """A handle whose replies may go through speculative decoding (`Engine` is one)."""

    @property
    def speculator(self) -> Speculator | None:
        """The speculative decoding in use; None when off."""


__all__ = [
    "NGRAM_SIZES",
    "VERIFY_ROWS",
    "Drafter",
    "ModelDraft",
    "NgramDraft",
    "SpecCosts",
    "Speculating",
    "Speculator",
    "Tuner",
    "fill_tiles",
    "propose",
]
