"""Request fields with llama-server's names, defaults, limits and error messages.

llama-server evaluates each field through a schema (tools/server/server-schema.cpp): `null` means
"use the default", a wrong JSON type or a value outside a hard limit is a 400 naming the field, and
soft limits are clamped. These helpers do the same so clients see the same answers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localfab.engine.reasoning import Thinking
from localfab.engine.toolcalls import ToolCalling
from localfab.engine.types import GenerationOptions, SamplingParams
from localfab.server.errors import ApiError
from localfab.server.settings import ServerSettings
from localfab.units import SAMPLING

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def json_type(value: Any) -> str:
    """nlohmann::json's type names, used in llama-server's type errors."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_error(name: str, want: str, value: Any) -> ApiError:
    return ApiError(
        f"Field '{name}': [json.exception.type_error.302] type must be {want}, "
        f"but is {json_type(value)}"
    )


def _fmt(value: float, integer: bool) -> str:
    # std::to_string: integers plainly, floats with six decimals.
    return str(int(value)) if integer else f"{value:.6f}"


def _present(body: Mapping[str, Any], *names: str) -> tuple[str, Any] | None:
    for name in names:
        if body.get(name) is not None:
            return name, body[name]
    return None


def number(
    body: Mapping[str, Any],
    *names: str,
    default: float,
    integer: bool = False,
    hard: tuple[float, float] | None = None,
    soft: tuple[float, float] | None = None,
) -> Any:
    """A numeric field (first of `names` present); booleans count as 0/1 as in nlohmann."""
    found = _present(body, *names)
    if found is None:
        return default
    name, value = found
    if not isinstance(value, int | float):
        raise _type_error(name, "number", value)
    value = float(value) if isinstance(value, float) else int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise _type_error(name, "number", None)
    if integer:
        value = math.trunc(value)
    if hard is not None:
        lo, hi = hard
        if not lo <= value <= hi:
            raise ApiError(
                f"Field '{name}': Value must be between {_fmt(lo, integer)} <= value <= "
                f"{_fmt(hi, integer)}, but got {_fmt(value, integer)}"
            )
    if soft is not None:
        value = max(soft[0], min(soft[1], value))
    elif integer and not -INT64_MAX <= value <= INT64_MAX:
        raise ApiError(f"Field '{name}': value {value} is out of range")
    return int(value) if integer else float(value)


def boolean(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "boolean", value)
    return value


def stop_words(body: Mapping[str, Any]) -> tuple[str, ...]:
    """`stop`: a string or an array of strings; empty strings are ignored."""
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list):
        words = []
        for word in value:
            if not isinstance(word, str):
                raise _type_error("stop", "string", word)
            if word:
                words.append(word)
        return tuple(words)
    return ()


N_PROBS_MAX = 1000


@dataclass(frozen=True)
class Generation:
    """One request's generation options, already validated."""

    n_predict: int
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool = False
    include_usage: bool = False
    cache_prompt: bool = True
    return_tokens: bool = False
    n_keep: int = 0
    n_probs: int = 0  # > 0: report each token's logprob and the n_probs most likely tokens
    n_cmpl: int = 1  # results per prompt (`n`)
    return_progress: bool = False  # streams carry prompt-processing progress
    timings_per_token: bool = False  # every chunk carries the timings so far
    post_sampling_probs: bool = False
    t_max_predict_ms: int = -1
    id_slot: int = -1  # the slot to run on (modulo the slots); -1: an idle one
    response_fields: tuple[str, ...] = ()  # native answers: only these (nested) fields
    verbose: bool | None = None  # None: as the server was started (--verbose)
    # A chat request to a thinking template: its tags (the engine splits the reply and keeps
    # the reasoning budget, see GenerationOptions.thinking).
    thinking: Thinking | None = None
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""
    # A chat request with tools: the reply's calls are parsed (and, with a grammar, held to
    # the tools' schemas); see chat.tools.plan_tools.
    tools: ToolCalling | None = None
    settings_json: dict[str, Any] = field(default_factory=dict, compare=False)

    def options(self) -> GenerationOptions:
        """What the engine generates for one result of this request (each job adds its own
        cancel Event and, with --context-shift, how a full window goes on)."""
        return GenerationOptions(
            max_tokens=self.n_predict,
            sampling=self.sampling,
            stop=self.stop,
            n_probs=self.n_probs,
            post_sampling_probs=self.post_sampling_probs,
            thinking=self.thinking,
            reasoning_budget=self.reasoning_budget,
            reasoning_budget_message=self.reasoning_budget_message,
            tools=self.tools,
        )


LogitBiasKey = int | str  # a token id, or text whose tokens all get the bias


def _logit_bias(body: Mapping[str, Any]) -> tuple[tuple[LogitBiasKey, float], ...]:
    """llama-server's logit_bias forms: {"token_id" or "text": bias} (OpenAI) or
    [[token_id or "text", bias], ...]; a bias of false bans (-inf).

    Text is tokenized later (`resolve_logit_bias`), token ids checked against the vocabulary.
    """
    raw = body.get("logit_bias")
    if raw is None:
        return ()
    pairs: list[tuple[Any, Any]]
    if isinstance(raw, dict):
        pairs = [(_bias_key(k), v) for k, v in raw.items()]
    elif isinstance(raw, list):
        if not all(isinstance(p, list) and len(p) == 2 for p in raw):
            raise ApiError(
                "Field 'logit_bias': each entry must be [token_id, bias] or [\"text\", bias]"
            )
        pairs = [(p[0], p[1]) for p in raw]
    else:
        raise ApiError("Field 'logit_bias' must be an object or an array")
    out: list[tuple[LogitBiasKey, float]] = []
    for key, bias in pairs:
        if isinstance(key, bool) or not isinstance(key, int | str):
            raise ApiError(
                f"Field 'logit_bias': {json.dumps(key)} is neither a token id nor a string"
            )
        if bias is False:
            value = -math.inf
        elif isinstance(bias, int | float) and not isinstance(bias, bool) and math.isfinite(bias):
            value = float(bias)
        else:
            raise ApiError(f"Field 'logit_bias': invalid bias {json.dumps(bias)} for {key!r}")
        out.append((key, value))
    return tuple(out)


def _bias_key(key: str) -> LogitBiasKey:
    """An object key: a token id when it is all digits (as strtol reads it), else text."""
    try:
        return int(key, 10)
    except ValueError:
        return key


def resolve_logit_bias(
    pairs: Sequence[tuple[LogitBiasKey, float]], tokenize: Callable[[str], list[int]]
) -> tuple[tuple[int, float], ...]:
    """Token ids as given; each string's tokens (no BOS, no special-token parsing) each get its
    bias, as llama-server does."""
    out: list[tuple[int, float]] = []
    for key, bias in pairs:
        if isinstance(key, str):
            out += [(tok, bias) for tok in tokenize(key)]
        else:
            out.append((key, bias))
    return tuple(out)


def _grammar(body: Mapping[str, Any]) -> str | None:
    """`json_schema` (converted to GBNF) or a GBNF `grammar`, as llama-server reads them."""
    from localfab.engine.grammar.convert import json_schema_to_gbnf
    from localfab.engine.grammar.limits import GrammarLimitError, check_grammar

    schema = body.get("json_schema")
    if schema is not None and body.get("grammar") is None:
        if not isinstance(schema, dict):
            raise _type_error("json_schema", "object", schema)
        if not schema:
            schema = {"type": "object"}
        try:
            return json_schema_to_gbnf(schema)
        except GrammarLimitError as exc:
            raise ApiError(f"Field 'json_schema': {exc}") from exc
        except Exception as exc:
            raise ApiError(f"Field 'json_schema': \"json_schema\": {exc}") from exc
    grammar = body.get("grammar")
    if grammar is None:
        return None
    if not isinstance(grammar, str):
        raise _type_error("grammar", "string", grammar)
    try:
        check_grammar(grammar)
    except GrammarLimitError as exc:
        raise ApiError(f"Field 'grammar': {exc}") from exc
    return grammar or None


def parse_generation(
    body: Mapping[str, Any],
    settings: ServerSettings,
    *,
    tokenize: Callable[[str], list[int]] | None = None,
    eog: Sequence[int] = (),
) -> Generation:
    """The fields every completion endpoint shares (after chat fields were mapped onto them).

    `tokenize` turns the text keys of `logit_bias` into tokens (without it they are refused).
    """
    n_predict = number(
        body,
        "n_predict",
        "max_completion_tokens",
        "max_tokens",
        default=settings.n_predict,
        integer=True,
        hard=(-1, INT32_MAX),
    )
    # llama-server's limit: one result per slot.
    n_cmpl = number(body, "n_cmpl", "n", default=1, integer=True, hard=(1, settings.n_parallel))
    sampling = _sampling(body, settings, tokenize)
    # llama-server has no bound; a negative count is meaningless and past a few hundred
    # alternatives a token's entry is megabytes of JSON: both are refused.
    n_probs = number(body, "n_probs", "logprobs", default=0, integer=True, hard=(0, N_PROBS_MAX))
    # Accepted for compatibility and validated for type, but not acted on.
    number(body, "n_indent", default=0, integer=True, hard=(0, INT32_MAX))
    n_keep = number(body, "n_keep", default=0, integer=True, hard=(-1, INT32_MAX))
    stream_options = body.get("stream_options")
    include_usage = (
        boolean(stream_options, "include_usage", False)
        if isinstance(stream_options, dict)
        else False
    )
    gen = Generation(
        n_predict=n_predict,
        sampling=sampling,
        stop=stop_words(body),
        stream=boolean(body, "stream", False),
        include_usage=include_usage,
        cache_prompt=boolean(body, "cache_prompt", True),
        return_tokens=boolean(body, "return_tokens", False),
        n_keep=n_keep,
        n_probs=n_probs,
        n_cmpl=n_cmpl,
        return_progress=boolean(body, "return_progress", False),
        timings_per_token=boolean(body, "timings_per_token", False),
        post_sampling_probs=boolean(body, "post_sampling_probs", False),
        t_max_predict_ms=number(
            body, "t_max_predict_ms", default=-1, integer=True, hard=(-1, INT64_MAX)
        ),
        id_slot=number(body, "id_slot", default=-1, integer=True, hard=(-1, INT32_MAX)),
        response_fields=_response_fields(body),
        verbose=body.get("verbose") if isinstance(body.get("verbose"), bool) else None,
    )
    object.__setattr__(gen, "settings_json", generation_settings(gen, eog=eog))
    return gen


def _sampling(
    body: Mapping[str, Any],
    settings: ServerSettings,
    tokenize: Callable[[str], list[int]] | None,
) -> SamplingParams:
    """The sampler settings of a request, the server's defaults where it gives none."""
    seed = number(body, "seed", default=settings.seed, integer=True)
    return SamplingParams(
        temperature=number(body, "temperature", default=settings.temperature, soft=(0, math.inf)),
        top_k=number(body, "top_k", default=settings.top_k, integer=True, soft=(0, INT32_MAX)),
        top_p=number(body, "top_p", default=settings.top_p, soft=(0.0, 1.0)),
        min_p=number(body, "min_p", default=settings.min_p, soft=(0.0, 1.0)),
        repeat_penalty=number(body, "repeat_penalty", default=settings.repeat_penalty),
        # -1: the whole context, as llama-server; the engine clamps larger values to n_ctx.
        repeat_last_n=number(
            body,
            "repeat_last_n",
            default=SAMPLING.repeat_last_n,
            integer=True,
            hard=(-1, INT32_MAX),
        ),
        frequency_penalty=number(body, "frequency_penalty", default=0.0),
        presence_penalty=number(body, "presence_penalty", default=0.0),
        seed=-1 if seed == -1 else seed & 0xFFFFFFFF,
        grammar=_grammar(body),
        ignore_eos=boolean(body, "ignore_eos", False),
        logit_bias=_bias_tokens(_logit_bias(body), tokenize),
    )


def _bias_tokens(
    pairs: tuple[tuple[LogitBiasKey, float], ...], tokenize: Callable[[str], list[int]] | None
) -> tuple[tuple[int, float], ...]:
    def no_tokenizer(text: str) -> list[int]:
        raise ApiError("Field 'logit_bias': text keys need the model's tokenizer")

    return resolve_logit_bias(pairs, tokenize or no_tokenizer)


def _response_fields(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("response_fields")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _type_error("response_fields", "array of strings", value)
    return tuple(value)


def generation_settings(
    gen: Generation, *, only_metrics: bool = False, eog: Sequence[int] = ()
) -> dict[str, Any]:
    """`generation_settings` / slot `params` with llama-server's keys (unsupported: defaults)."""
    s = gen.sampling
    data: dict[str, Any] = {
        "seed": 0xFFFFFFFF if s.seed < 0 else s.seed,
        "temperature": s.temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "top_n_sigma": -1.0,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "typical_p": 1.0,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": 0.0,
        "dry_base": 1.75,
        "dry_allowed_length": 2,
        "dry_penalty_last_n": -1,
        "mirostat": 0,
        "mirostat_tau": 5.0,
        "mirostat_eta": 0.1,
        "stop": list(gen.stop),
        "max_tokens": gen.n_predict,
        "n_predict": gen.n_predict,
        "n_keep": gen.n_keep,
        "n_discard": 0,
        "ignore_eos": s.ignore_eos,
        "stream": gen.stream,
        # As llama-server: -inf is null, and ignore_eos bans the end-of-generation tokens.
        "logit_bias": [{"bias": None if b == -math.inf else b, "token": t} for t, b in s.logit_bias]
        + [{"bias": None, "token": t} for t in (eog if s.ignore_eos else ())],
        "n_probs": gen.n_probs,
        "min_keep": 0,
        "grammar": s.grammar or "",
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
        "timings_per_token": gen.timings_per_token,
        "post_sampling_probs": gen.post_sampling_probs,
        "lora": [],
    }
    if only_metrics:
        for key in ("stop", "logit_bias", "grammar"):
            data.pop(key)
    return data
