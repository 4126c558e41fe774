"""Response bodies in llama-server's shapes (tools/server/server-task.cpp), field for field.

Three dialects share one generation: native `/completion` (`content`, `stop`, `timings`, no
`[DONE]`), OpenAI `/v1/completions` (`text_completion`) and `/v1/chat/completions`
(`chat.completion[.chunk]`). Streams are Server-Sent Events framed `data: {json}\\n\\n`.
"""

from __future__ import annotations

import secrets
import string
import time
from dataclasses import dataclass
from typing import Any

from localfab.engine.types import Done
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
    return "stop" if done.stop_type in ("eos", "word") else "length"


def usage(done: Done) -> dict[str, Any]:
    n_gen = done.timings.predicted_n
    return {
        "completion_tokens": n_gen,
        "prompt_tokens": done.prompt_tokens,
        "total_tokens": n_gen + done.prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": done.timings.cache_n},
    }


@dataclass(frozen=True)
class Reply:
    """What every chunk of one response shares."""

    id: str
    model: str
    fingerprint: str
    n_prompt: int
    created: int = 0

    def now(self) -> int:
        return self.created or int(time.time())


# --- native /completion ---------------------------------------------------------------------


def native_partial(reply: Reply, text: str, token: int, n_decoded: int) -> dict[str, Any]:
    return {
        "index": 0,
        "content": text,
        "tokens": [token] if token >= 0 else [],
        "stop": False,
        "id_slot": -1,  # as llama-server's partial chunks
        "tokens_predicted": n_decoded,
        "tokens_evaluated": reply.n_prompt,
    }


def native_final(
    reply: Reply,
    done: Done,
    *,
    stream: bool,
    prompt_text: str,
    settings: dict[str, Any],
    return_tokens: bool,
) -> dict[str, Any]:
    return {
        "index": 0,
        "content": "" if stream else done.text,
        "tokens": list(done.tokens) if return_tokens and not stream else [],
        "id_slot": 0,
        "stop": True,
        "model": reply.model,
        "tokens_predicted": done.timings.predicted_n,
        "tokens_evaluated": done.prompt_tokens,
        "generation_settings": settings,
        "prompt": prompt_text,
        "has_new_line": "\n" in done.text,
        "truncated": done.stop_type == "context",
        "stop_type": _STOP_TYPE.get(done.stop_type, "none"),
        "stopping_word": done.stopping_word,
        "tokens_cached": done.prompt_tokens + max(done.timings.predicted_n - 1, 0),
        "timings": done.timings.to_dict(),
    }


# --- OpenAI /v1/completions -----------------------------------------------------------------


def _cmpl_envelope(reply: Reply, choice: dict[str, Any]) -> dict[str, Any]:
    return {
        "choices": [choice],
        "created": reply.now(),
        "model": reply.model,
        "system_fingerprint": reply.fingerprint,
        "object": "text_completion",
        "id": reply.id,
    }


def cmpl_partial(reply: Reply, text: str) -> dict[str, Any]:
    return _cmpl_envelope(
        reply, {"text": text, "index": 0, "logprobs": None, "finish_reason": None}
    )


def cmpl_final(reply: Reply, done: Done, *, stream: bool) -> dict[str, Any]:
    choice = {
        "text": "" if stream else done.text,
        "index": 0,
        "logprobs": None,
        "finish_reason": finish_reason(done),
    }
    res = _cmpl_envelope(reply, choice)
    res["usage"] = usage(done)
    res["timings"] = done.timings.to_dict()
    return res


# --- OpenAI /v1/chat/completions ------------------------------------------------------------


def chat_final(reply: Reply, done: Done) -> dict[str, Any]:
    return {
        "choices": [
            {
                "finish_reason": finish_reason(done),
                "index": 0,
                "message": {"role": "assistant", "content": done.text},
            }
        ],
        "created": reply.now(),
        "model": reply.model,
        "system_fingerprint": reply.fingerprint,
        "object": "chat.completion",
        "usage": usage(done),
        "id": reply.id,
        "timings": done.timings.to_dict(),
    }


def chat_chunk(reply: Reply, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": reply.now(),
        "id": reply.id,
        "model": reply.model,
        "system_fingerprint": reply.fingerprint,
        "object": "chat.completion.chunk",
    }


def chat_role_chunk(reply: Reply) -> dict[str, Any]:
    """The first chunk of every chat stream, as OpenAI and llama-server send it."""
    return chat_chunk(reply, {"role": "assistant", "content": None})


def chat_final_chunks(reply: Reply, done: Done, *, include_usage: bool) -> list[dict[str, Any]]:
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
    return chunks
