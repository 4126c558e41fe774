"""Response bodies in llama-server's shapes (tools/server/server-task.cpp), field for field.

Three dialects share one generation: native `/completion` (`content`, `stop`, `timings`, no
`[DONE]`), OpenAI `/v1/completions` (`text_completion`) and `/v1/chat/completions`
(`chat.completion[.chunk]`). Streams are Server-Sent Events framed `data: {json}\\n\\n`.
"""

from __future__ import annotations

import codecs
import math
import secrets
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localfab import units
from localfab.engine.types import Done, TokenProbs
from localfab.server.errors import dumps

_ALNUM = string.digits + string.ascii_uppercase + string.ascii_lowercase


def completion_id() -> str:
    """`chatcmpl-` + 32 random letters and digits, as llama-server's gen_chatcmplid."""
    return "chatcmpl-" + "".join(secrets.choice(_ALNUM) for _ in range(32))


def sse(data: Any) -> bytes:
    return b"data: " + dumps(data) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"

# The engine's stop kinds -> llama-server's stop_type.
_STOP_TYPE = {"eos": "eos", "word": "word", "limit": "limit", "context": "limit"}


def finish_reason(done: Done) -> str:
    """ "stop" at an end of generation or a stop word ("tool_calls" when the reply made calls),
    "length" otherwise, as llama-server."""
    if done.stop_type in ("eos", "word"):
        return "tool_calls" if done.tool_calls else "stop"
    return "length"


def usage(done: Done) -> dict[str, Any]:
    return units.usage(done.prompt_tokens, done.completion_tokens, cached=done.timings.cache_n)


# --- token probabilities (n_probs / logprobs) ------------------------------------------------


def _piece_text(piece: bytes) -> str:
    """A token's text with an incomplete UTF-8 character at its end cut, as llama-server does."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(piece, final=False)


def probs_entries(items: Sequence[tuple[int, TokenProbs]]) -> list[dict[str, Any]]:
    """llama-server's completion_probabilities / logprobs.content entries, one per token:
    log-probabilities of the raw distribution, or with post_sampling_probs the probabilities
    the sampler chain drew from (`prob` and `top_probs`, as llama-server names them)."""
    return [_probs_entry(token, probs) for token, probs in items]


def _probs_entry(token: int, probs: TokenProbs) -> dict[str, Any]:
    if probs.post:
        return {
            "id": token,
            "token": _piece_text(probs.piece),
            "bytes": list(probs.piece),
            "prob": math.exp(probs.logprob),
            "top_probs": [
                {"id": t, "token": _piece_text(piece), "bytes": list(piece), "prob": math.exp(lp)}
                for t, piece, lp in probs.top
            ],
        }
    return {
        "id": token,
        "token": _piece_text(probs.piece),
        "bytes": list(probs.piece),
        "logprob": probs.logprob,
        "top_logprobs": [
            {"id": t, "token": _piece_text(piece), "bytes": list(piece), "logprob": logprob}
            for t, piece, logprob in probs.top
        ],
    }


@dataclass(frozen=True)
class ResultMeta:
    """What every chunk of one response shares."""

    id: str
    model: str
    fingerprint: str
    n_prompt: int
    created: int = 0
    index: int = 0  # which result of the request (several prompts, or n > 1)
    # What a chat left out to fit the window: {"turns": n, "exchanges": n, "tokens": n}.
    context_shift: dict[str, int] | None = None
    slot: int = 0  # the slot that ran it (`id_slot` of the final answer)
    shifted: bool = False  # the context shifted during the reply (llama-server's `truncated`)

    def now(self) -> int:
        return self.created or int(time.time())


# --- native /completion ---------------------------------------------------------------------


def native_partial(
    reply: ResultMeta, text: str, token: int, n_decoded: int, probs: TokenProbs | None = None
) -> dict[str, Any]:
    res: dict[str, Any] = {
        "index": reply.index,
        "content": text,
        "tokens": [token] if token >= 0 else [],
        "stop": False,
        "id_slot": -1,  # as llama-server's partial chunks
        "tokens_predicted": n_decoded,
        "tokens_evaluated": reply.n_prompt,
    }
    if probs is not None:
        res["completion_probabilities"] = probs_entries([(token, probs)])
    return res


def native_final(
    reply: ResultMeta,
    done: Done,
    *,
    stream: bool,
    prompt_text: str,
    settings: dict[str, Any],
    return_tokens: bool,
    probs: Sequence[tuple[int, TokenProbs]] = (),
) -> dict[str, Any]:
    res = {
        "index": reply.index,
        "content": "" if stream else done.text,
        "tokens": list(done.tokens) if return_tokens and not stream else [],
        "id_slot": reply.slot,
        "stop": True,
        "model": reply.model,
        "tokens_predicted": done.timings.predicted_n,
        "tokens_evaluated": done.prompt_tokens,
        "generation_settings": settings,
        "prompt": prompt_text,
        "has_new_line": "\n" in done.text,
        "truncated": done.stop_type == "context" or reply.shifted,
        "stop_type": _STOP_TYPE.get(done.stop_type, "none"),
        "stopping_word": done.stopping_word,
        "tokens_cached": done.prompt_tokens + max(done.timings.predicted_n - 1, 0),
        "timings": done.timings.to_dict(),
    }
    if probs and not stream:
        res["completion_probabilities"] = probs_entries(probs)
    return res


# --- OpenAI /v1/completions -----------------------------------------------------------------


def _cmpl_envelope(reply: ResultMeta, choice: dict[str, Any]) -> dict[str, Any]:
    return {
        "choices": [choice],
        "created": reply.now(),
        "model": reply.model,
        "system_fingerprint": reply.fingerprint,
        "object": "text_completion",
        "id": reply.id,
    }


def _logprobs(probs: Sequence[tuple[int, TokenProbs]]) -> dict[str, Any] | None:
    return {"content": probs_entries(probs)} if probs else None


def cmpl_partial(
    reply: ResultMeta, text: str, probs: Sequence[tuple[int, TokenProbs]] = ()
) -> dict[str, Any]:
    return _cmpl_envelope(
        reply,
        {"text": text, "index": reply.index, "logprobs": _logprobs(probs), "finish_reason": None},
    )


def cmpl_final(
    reply: ResultMeta, done: Done, *, stream: bool, probs: Sequence[tuple[int, TokenProbs]] = ()
) -> dict[str, Any]:
    choice = {
        "text": "" if stream else done.text,
        "index": reply.index,
        "logprobs": None if stream else _logprobs(probs),
        "finish_reason": finish_reason(done),
    }
    res = _cmpl_envelope(reply, choice)
    res["usage"] = usage(done)
    res["timings"] = done.timings.to_dict()
    return res


# --- OpenAI /v1/chat/completions ------------------------------------------------------------


def _shifted(reply: ResultMeta) -> bool:
    shift = reply.context_shift
    return bool(shift and (shift.get("turns") or shift.get("exchanges")))


def chat_final(
    reply: ResultMeta,
    done: Done,
    probs: Sequence[tuple[int, TokenProbs]] = (),
    *,
    content: str | None = None,
    reasoning: str = "",
    tool_calls: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The whole answer; `content` and `reasoning` where a thinking model's reply was split
    (`reasoning_content` only when there is some, as llama-server), and its `tool_calls`."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": done.text if content is None else content,
    }
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    choice: dict[str, Any] = {
        "finish_reason": finish_reason(done),
        "index": reply.index,
        "message": message,
    }
    if probs:
        choice["logprobs"] = _logprobs(probs)
    return {
        "choices": [choice],
        "created": reply.now(),
        "model": reply.model,
        "system_fingerprint": reply.fingerprint,
        "object": "chat.completion",
        "usage": usage(done),
        "id": reply.id,
        "timings": done.timings.to_dict(),
        **({"context_shift": reply.context_shift} if _shifted(reply) else {}),
    }


def chat_chunk(
    reply: ResultMeta,
    delta: dict[str, Any],
    finish: str | None = None,
    probs: Sequence[tuple[int, TokenProbs]] = (),
) -> dict[str, Any]:
    choice: dict[str, Any] = {"finish_reason": finish, "index": reply.index, "delta": delta}
    if probs:
        choice["logprobs"] = _logprobs(probs)
    return {
        "choices": [choice],
        "created": reply.now(),
        "id": reply.id,
        "model": reply.model,
        "system_fingerprint": reply.fingerprint,
        "object": "chat.completion.chunk",
    }


def tool_call_json(name: str, arguments: str, call_id: str) -> dict[str, Any]:
    """One call in a message's `tool_calls`, as llama-server writes it."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}, "id": call_id}


def tool_call_delta(index: int, name: str, arguments: str, call_id: str) -> dict[str, Any]:
    """One call's piece in a stream's `delta.tool_calls`: id, type and name when it first
    appears, then fragments of its arguments (empty fields left out, as llama-server)."""
    item: dict[str, Any] = {"index": index}
    if call_id:
        item["id"] = call_id
        item["type"] = "function"
    function = {}
    if name:
        function["name"] = name
    if arguments:
        function["arguments"] = arguments
    item["function"] = function
    return {"tool_calls": [item]}


def chat_role_chunk(reply: ResultMeta) -> dict[str, Any]:
    """The first chunk of every chat stream, as OpenAI and llama-server send it."""
    return chat_chunk(reply, {"role": "assistant", "content": None})


def chat_final_chunks(
    reply: ResultMeta, done: Done, *, include_usage: bool
) -> list[dict[str, Any]]:
    """Empty delta with finish_reason, then usage (if asked); `timings` on the last one."""
    chunks = [chat_chunk(reply, {}, finish_reason(done))]
    if include_usage:
        chunks.append(
            {
                "choices": [],
                "created": reply.now(),
                "id": reply.id,
                "model": reply.model,
                "system_fingerprint": reply.fingerprint,
                "object": "chat.completion.chunk",
                "usage": usage(done),
            }
        )
    chunks[-1]["timings"] = done.timings.to_dict()
    if _shifted(reply):
        chunks[-1]["context_shift"] = reply.context_shift
    return chunks
