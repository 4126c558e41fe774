"""Plain data the engine hands to the layers above it; importable without llama_cpp."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Protocol

from localfab.engine.callsyntax import Call, CallDelta
from localfab.engine.reasoning import Thinking
from localfab.engine.toolcalls import ToolCalling
from localfab.errors import UsageError
from localfab.units import KV_CACHE_TYPES, SAMPLING, completion_tokens, usage

FlashAttn = Literal["auto", "on", "off"]
FinishReason = Literal["stop", "length", "cancelled"]
# What stopped a generation: an end-of-generation token, a stop string, the max_tokens limit,
# a full context window, a cancel; "none" when nothing was generated (an empty prompt).
StopType = Literal["eos", "word", "limit", "context", "cancel", "none"]

# KV cache element types by their llama.cpp names (-ctk / -ctv): the one list, in units.
KV_TYPES = KV_CACHE_TYPES


@dataclass(frozen=True)
class EngineSettings:
    """How one model is loaded. The planner fills these in; every field has a safe default."""

    n_ctx: int = 4096
    n_gpu_layers: int = 0
    n_threads: int = 0  # 0: physical cores
    n_threads_batch: int = 0  # 0: same as n_threads
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: FlashAttn = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    use_mmap: bool = True
    # Full-size sliding-window cache: needed to reuse a cached prefix and to shift the KV cache of
    # models with sliding-window layers (Gemma 2/3); without it llama.cpp keeps only the window.
    swa_full: bool = True
    # Offload host-side matrix ops to the GPU for large batches; the planner turns it off when
    # the GPU cannot hold the extra compute buffer.
    op_offload: bool = True
    warmup: bool = True  # one throw-away decode at load so the first request is not slow
    # Repack weights for llama.cpp's faster CPU matrix kernels (a batch of 4 or more tokens then
    # uses other kernels than one token, whose last bits differ; see `batch_invariant`).
    repack: bool = True
    # Compute every row of a batch with the kernels of one token, so that a batch's logits are
    # bit for bit those of one-token decodes (exact speculative decoding verifies long drafts
    # so): no repacked weights, and llama.cpp's tiled K-quant matrix kernels, which it takes
    # from 8 rows on, left off for the whole process (GGML_CPU_TILED_MM=0; llama.cpp reads it
    # once, at the first matrix product of the process, so a model computed earlier in the
    # process keeps them). Prompts then go through the one-row kernels too (slower to
    # process); one-token decoding is unchanged. With an f16 or f32 KV cache flash attention
    # still splits one token over the threads past 512 cells: quantize K (or V).
    batch_invariant: bool = False
    # Sequences the context holds at once (the server's parallel slots, -np). Each gets
    # n_ctx / n_seq_max cells, unless `kv_unified` makes them share one pool of n_ctx.
    n_seq_max: int = 1
    kv_unified: bool = False


@dataclass(frozen=True)
class SamplingParams:
    """Sampling knobs with llama-server's meanings; temperature <= 0 is greedy."""

    temperature: float = SAMPLING.temperature
    top_k: int = SAMPLING.top_k
    top_p: float = SAMPLING.top_p
    min_p: float = SAMPLING.min_p
    repeat_penalty: float = SAMPLING.repeat_penalty
    repeat_last_n: int = SAMPLING.repeat_last_n
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int = -1  # -1: a random seed
    grammar: str | None = None  # GBNF; constrains the output (JSON mode, schemas)
    # With a grammar: lazy, it waits until the text matches one of these regular expressions
    # (llama.cpp's trigger patterns; the first group, or the match, is where it starts).
    grammar_triggers: tuple[str, ...] = ()
    ignore_eos: bool = False  # never pick an end-of-generation token (benchmarks)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias); -inf bans a token

    @classmethod
    def greedy(cls) -> SamplingParams:
        return cls(temperature=0.0)


ContextFull = Callable[[list[int]], Sequence[int] | None]

# Ways to draft tokens for speculative decoding, by llama-server's names (--spec-type).
SpecType = Literal["none", "ngram-simple", "draft-simple"]
SPEC_TYPES: tuple[SpecType, ...] = ("none", "ngram-simple", "draft-simple")
DRAFT_MAX_LIMIT = 64  # the most tokens one draft may hold (--draft-max)
# Default draft lengths: prompt lookup drafts as far as a copy has held (llama-server's
# ngram-simple drafts m-grams of 48), a draft model pays for every token it drafts (16, as
# llama-server's --draft-max).
DRAFT_MAX_LOOKUP = 48
DRAFT_MAX_MODEL = 16
# Up to this many cells of cache llama.cpp's CPU flash attention keeps one token on one thread;
# past them it splits it over the threads with an f16 or f32 cache, and a batch's it does not.
ONE_THREAD_CELLS = 256


@dataclass(frozen=True)
class SpecSettings:
    """Speculative decoding: how tokens are drafted and how many (llama-server's meanings).

    `spec_type` "ngram-simple" drafts from n-grams of the prompt and the reply so far;
    "draft-simple" asks the draft model `model_draft` (same vocabulary, drafting greedily).
    `draft_max` caps a draft (`max_draft`: by default 48 tokens for prompt lookup, 16 for a
    draft model); shorter drafts than `draft_min` are not verified; the draft model stops
    drafting below probability `draft_p_min`. With `adaptive` speculation pauses while it
    costs more than it saves, a draft model's draft length follows the measured acceptance, and
    a prompt lookup drafts a copy as far again as it has held (`spec.propose`); without, every
    draft is as long as the lookup allows (tests and benchmarks). With `exact`
    a verify holds no more tokens than llama.cpp computes exactly as it computes one (see
    `exactness.exact_batch`), so the text is plain decoding's; without, drafts may be as long as
    `draft_max`, as in llama-server, and a near tie may be broken the other way.
    """

    spec_type: SpecType = "none"
    draft_max: int | None = None  # None: DRAFT_MAX_LOOKUP or DRAFT_MAX_MODEL, by spec_type
    draft_min: int = 0
    draft_p_min: float = 0.75
    model_draft: str | None = None
    n_gpu_layers_draft: int | None = None
    adaptive: bool = True
    exact: bool = True

    @property
    def enabled(self) -> bool:
        return self.spec_type != "none"

    @property
    def max_draft(self) -> int:
        """The most tokens one draft may hold: `draft_max`, or the default for the kind."""
        if self.draft_max is not None:
            return self.draft_max
        return DRAFT_MAX_MODEL if self.spec_type == "draft-simple" else DRAFT_MAX_LOOKUP

    def check(self) -> None:
        """UsageError naming the setting for a value speculation cannot use."""
        if self.spec_type not in SPEC_TYPES:
            raise UsageError(
                f"--spec-type must be one of {', '.join(SPEC_TYPES)}, not {self.spec_type!r}"
            )
        if not 1 <= self.max_draft <= DRAFT_MAX_LIMIT:
            raise UsageError(
                f"--draft-max must be 1 to {DRAFT_MAX_LIMIT} tokens, not {self.draft_max}"
            )
        if not 0 <= self.draft_min <= self.max_draft:
            raise UsageError(
                f"--draft-min must be 0 to --draft-max ({self.max_draft}), not {self.draft_min}"
            )
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise UsageError(f"--draft-p-min must be a number from 0 to 1, not {self.draft_p_min}")
        if self.spec_type == "draft-simple" and not self.model_draft:
            raise UsageError("--spec-type draft-simple needs a draft model: give it with -md FILE")

    def load_settings(
        self, settings: EngineSettings, *, keep_cache: bool = False
    ) -> tuple[EngineSettings, str | None]:
        """Settings on which exact speculation verifies whole drafts, and what changed.

        On the CPU: batch-invariant kernels and, where K and V share an f16 or f32 cache, a
        q8_0 K cache (V stays): over such a cache one token's flash attention takes another
        path than a batch's past `ONE_THREAD_CELLS`, over any other both take the same. A
        verify can then hold a whole draft at any length and computes what one-token decoding
        computes at these settings, so drafting never changes the text of this load. (A q8_0
        K with an f16 V is the cheapest such cache measured: a verified token costs about what
        it costs at the planned settings, where a q8_0 V, dequantized for every cell, costs a
        tenth more.) `run`, `serve` and the chat app load so when exact speculation is on
        (`ModelChoice.open`). Plain decoding at the planned settings uses other kernels and
        another cache, so a close call there can go the other way. `keep_cache` keeps a cache
        the user chose (-ctk/-ctv): past `ONE_THREAD_CELLS` an f16 one then verifies no draft.
        With layers on a GPU, or without flash attention (a quantized cache needs it), the
        settings stay.
        """
        if not self.enabled or not self.exact or settings.n_gpu_layers != 0:
            return settings, None
        if settings.flash_attn == "off":
            return settings, None
        split = settings.type_k == settings.type_v and settings.type_k in ("f16", "f32")
        new = replace(
            settings,
            batch_invariant=True,
            type_k="q8_0" if split and not keep_cache else settings.type_k,
        )
        if new == settings:
            return settings, None
        said = ""
        if new.type_k != settings.type_k:
            said = f", KV cache {_pair(new.type_k, new.type_v)} "
            said += f"(planned: {_pair(settings.type_k, settings.type_v)})"
        return new, (
            "exact speculative decoding: loading with one-token kernels for batches"
            f"{said}, so that a verified draft is computed as one token is and drafts never "
            "change the text (prompts are processed about a quarter slower)"
        )


def _pair(type_k: str, type_v: str) -> str:
    """A KV cache's types as the user would name them: one word when K and V agree."""
    return type_k if type_k == type_v else f"K {type_k}, V {type_v}"


@dataclass(frozen=True)
class GenerationOptions:
    """What one generation asks for besides its prompt (`Engine.stream` / `Engine.generate`).

    `max_tokens` -1 is no limit. `cancel` stops generation at the next token. When the window
    fills, `on_context_full(generated)` returns the tokens the cache should hold instead (the
    engine shifts to them and goes on) or None to end the reply ("length", stop_type
    "context"). `carry` is the incomplete UTF-8 of a reply this one continues. With `n_probs`
    > 0 every TokenEvent carries the token's log-probability and the `n_probs` likeliest tokens;
    with `post_sampling_probs` those come from the sampler chain's output (the candidates it
    kept, with the probabilities it drew from) instead of the model's raw distribution.
    """

    max_tokens: int = -1
    sampling: SamplingParams = SamplingParams()
    stop: Sequence[str] = ()  # kept as a tuple
    cancel: threading.Event | None = None
    on_context_full: ContextFull | None = None
    carry: bytes = b""
    n_probs: int = 0
    post_sampling_probs: bool = False
    # A thinking template's tags: the reply's text is split into reasoning and answer as it
    # comes (TokenEvent.parts, Done.reasoning / Done.content), and with `reasoning_budget` >= 0
    # the block is closed after that many tokens (`reasoning_budget_message` before the
    # closing tag), as llama-server's --reasoning-budget. See `engine.thought`.
    thinking: Thinking | None = None
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""
    # A request with tools: the reply's calls are parsed out of its answer as it comes
    # (TokenEvent.calls, Done.tool_calls), see `engine.toolcalls`.
    tools: ToolCalling | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stop, tuple):  # a list from a caller: keep the value immutable
            object.__setattr__(self, "stop", tuple(self.stop))


@dataclass(frozen=True)
class Timings:
    """Per-request timings, named and defined as in llama-server's `timings` object.

    prompt_ms runs from the start of prompt processing to the first sampled token;
    predicted_ms from the first sampled token to the last one; cache_n counts prompt tokens
    reused from the KV cache (not processed again), prompt_n the ones that were processed.
    """

    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    ttft_ms: float = 0.0  # request start (before tokenizing the reply) to first token
    # The energy the reply took, where the machine reports power (see localfab.machine.energy).
    energy_j: float | None = None
    energy_source: str = ""
    # Speculative decoding: tokens drafted, and how many of them the model kept.
    draft_n: int = 0
    draft_n_accepted: int = 0
    draft_verifies: int = 0  # decodes that verified a draft (for /metrics; not in timings)
    # Of cache_n, the tokens a kept state gave back (the prompt cache), the time that took and
    # where the state was ("ram" or "disk"); not in llama-server's timings object.
    restored_n: int = 0
    restore_ms: float = 0.0
    restored_from: str = ""

    @property
    def draft_acceptance(self) -> float:
        """The share of drafted tokens that were kept (0.0 when nothing was drafted)."""
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0

    @property
    def prompt_per_token_ms(self) -> float:
        return self.prompt_ms / self.prompt_n if self.prompt_n else 0.0

    @property
    def prompt_per_second(self) -> float:
        return 1e3 * self.prompt_n / self.prompt_ms if self.prompt_ms > 0 else 0.0

    @property
    def predicted_steps(self) -> int:
        """Tokens decoded within predicted_ms: the first one comes with the prompt's time."""
        return max(self.predicted_n - 1, 0)

    @property
    def predicted_per_token_ms(self) -> float:
        steps = self.predicted_steps
        return self.predicted_ms / steps if steps else 0.0

    @property
    def predicted_per_second(self) -> float:
        steps = self.predicted_steps
        return 1e3 * steps / self.predicted_ms if self.predicted_ms > 0 else 0.0

    def to_dict(self) -> dict[str, float | int | str | None]:
        """llama-server's field names and order; the energy fields only where it was measured."""
        out: dict[str, float | int | str | None] = {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_per_token_ms,
            "prompt_per_second": self.prompt_per_second,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_per_token_ms,
            "predicted_per_second": self.predicted_per_second,
        }
        if self.draft_n:  # as llama-server: only for a reply that drafted
            out["draft_n"] = self.draft_n
            out["draft_n_accepted"] = self.draft_n_accepted
        if self.energy_j is not None:
            out["energy_j"] = self.energy_j
            out["tokens_per_j"] = self.predicted_n / self.energy_j if self.energy_j > 0 else None
            out["energy_source"] = self.energy_source
        return out


@dataclass(frozen=True)
class TokenProbs:
    """How likely a generated token was, and its most likely alternatives.

    Log-probabilities of the model's own distribution (softmax of the raw logits, before any
    sampler), as llama-server reports them by default; with `post`, of the distribution the
    sampler chain drew from (only the candidates it kept). `piece` is the token's bytes (special
    tokens: empty, as llama-server shows them); `top` is (token, piece, logprob), most likely
    first.
    """

    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...]
    post: bool = False  # after the sampler chain (post_sampling_probs), not the raw softmax


@dataclass(frozen=True)
class TokenEvent:
    """One generated token and the text it completes (may be "" while UTF-8 or a stop is held)."""

    token: int
    text: str
    probs: TokenProbs | None = None  # when the caller asked for n_probs
    # With GenerationOptions.thinking: the text split so far, (kind, text) with kind
    # "reasoning" or "content" (a tag cut over two tokens is held back until it is whole);
    # None where the reply is not split (all of `text` is the answer).
    parts: tuple[tuple[str, str], ...] | None = None
    # With GenerationOptions.tools: what this token added to the reply's tool calls.
    calls: tuple[CallDelta, ...] = ()


@dataclass(frozen=True)
class Done:
    """The end of a generation: the whole text, why it stopped, and its timings."""

    text: str
    finish_reason: FinishReason
    stop_type: StopType  # "eos", "word" (a stop string), "limit" (max_tokens), "context"...
    tokens: tuple[int, ...]
    timings: Timings
    prompt_tokens: int
    stopping_word: str = ""
    pending: bytes = b""  # an incomplete UTF-8 character at the end, for a continuation
    # With GenerationOptions.thinking: `text` split into the reasoning and the answer, the
    # tokens the reasoning took (its tags included) and whether the budget closed the block.
    reasoning: str | None = None
    content: str = ""
    reasoning_tokens: int = 0
    budget_hit: bool = False
    in_reasoning: bool = False  # the reply ended inside its block (a continuation goes on there)
    # With GenerationOptions.tools: the reply's calls (`content` is then the answer without
    # them); None where the request named no tools.
    tool_calls: tuple[Call, ...] | None = None

    @property
    def answer(self) -> str:
        """The reply without its reasoning and tool calls (the whole text where it was not
        split)."""
        return self.text if self.reasoning is None and self.tool_calls is None else self.content

    @property
    def completion_tokens(self) -> int:
        """Sampled tokens, the end-of-generation one included, as llama-server counts them."""
        return completion_tokens(len(self.tokens), self.stop_type)

    @property
    def usage(self) -> dict[str, Any]:
        return usage(self.prompt_tokens, self.completion_tokens)

    def to_dict(self) -> dict[str, object]:
        return {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "stop_type": self.stop_type,
            "stopping_word": self.stopping_word,
            "usage": self.usage,
            "timings": self.timings.to_dict(),
        }


@dataclass(frozen=True)
class BufferSizes:
    """Buffer sizes llama.cpp reports when it loads a model (bytes, summed over devices)."""

    model_bytes: int
    kv_bytes: int
    compute_bytes: int
    by_device: dict[str, dict[str, int]] = field(default_factory=dict)
    repacked_bytes: int = 0  # of model_bytes, weights repacked for the CPU's faster kernels

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class ChatEngine(Protocol):
    """The part of an engine a chat session drives: `Engine`, and the TUI's fake engine."""

    @property
    def n_ctx(self) -> int: ...

    @property
    def can_shift(self) -> bool: ...

    def shift_to(self, target: Sequence[int]) -> tuple[int, int]: ...

    def evaluate(self, tokens: Sequence[int]) -> int: ...

    def stream(
        self, prompt: Sequence[int], options: GenerationOptions
    ) -> Iterator[TokenEvent | Done]: ...


def outside_vocab(tokens: Iterable[object], n_vocab: int) -> object | None:
    """The first of `tokens` that is not a token id of a vocabulary of `n_vocab` (an int, not
    a bool, in 0..n_vocab-1); None when all are. Every check of client tokens uses this."""
    for tok in tokens:
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < n_vocab:
            return tok
    return None


def vocab_message(tok: object, n_vocab: int) -> str:
    """What to say about a token id outside the vocabulary."""
    return f"token id {tok!r} is out of the vocabulary (0..{n_vocab - 1})"
