"""Handlers that read the server's state, the model's facts or its vocabulary: /health,
/v1/models, /props, /slots, /metrics, /tokenize and /detokenize (and the endpoints this server
does not offer)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from localfab.server import metrics as prom
from localfab.server.checks import check_tokens
from localfab.server.completions import PROMPT_TYPES
from localfab.server.errors import ApiError
from localfab.server.params import boolean, generation_settings, parse_generation
from localfab.server.plumbing import json_response, read_json

if TYPE_CHECKING:
    from localfab.runtime import LoadedModel
    from localfab.server.state import Server


async def health(server: Server, request: Request) -> Response:
    failure = server.worker.failure  # the engine thread stopped: nothing will be answered
    if failure is not None:
        raise failure
    return json_response({"status": "ok"})


async def props(server: Server, request: Request) -> Response:
    info = server.info
    assert info is not None
    s = server.settings
    return json_response(
        {
            "default_generation_settings": {
                "params": generation_settings(parse_generation({}, s), only_metrics=True),
                "n_ctx": server.slot_n_ctx,
            },
            "total_slots": s.n_parallel,
            "model_alias": info.name,
            "model_ftype": info.ftype,
            "model_path": info.path,
            "modalities": {"vision": info.vision, "video": False, "audio": False},
            "media_marker": MEDIA_MARKER,
            "endpoint_slots": s.slots,
            "endpoint_props": False,
            "endpoint_metrics": s.metrics,
            "ui": False,
            "ui_settings": {},
            "chat_template": info.chat_template,
            "chat_template_caps": server.caps,
            "bos_token": info.bos_token,
            "eos_token": info.eos_token,
            "build_info": s.build_info,
            "is_sleeping": server.worker.sleeping,
            "cors_proxy_enabled": False,
        }
    )


# Where media would go in a prompt; this server takes text only, so it is a fixed string.
MEDIA_MARKER = "<__media__>"


async def props_post(server: Server, request: Request) -> Response:
    raise ApiError(
        "This server does not support changing global properties",
        "not_supported_error",
    )


async def slots(server: Server, request: Request) -> Response:
    if not server.settings.slots:
        raise ApiError(
            "This server does not support slots endpoint. Start it with `--slots`",
            "not_supported_error",
        )
    out = [server.slot_json(i) for i in range(server.settings.n_parallel)]
    if request.query_params.get("fail_on_no_slot") and all(s["is_processing"] for s in out):
        raise ApiError("no slot available", "unavailable_error")
    return json_response(out)


async def metrics(server: Server, request: Request) -> Response:
    if not server.settings.metrics:
        raise ApiError(
            "This server does not support metrics endpoint. Start it with `--metrics`",
            "not_supported_error",
        )
    m = server.worker.metrics
    text = prom.render(
        m,
        n_processing=server.n_processing,
        n_deferred=server.worker.queued,
        cache=server.worker.prompt_cache,
    )
    m.reset_bucket()  # the gauges are averaged over the time between two scrapes
    response = Response(text.encode(), media_type=prom.CONTENT_TYPE)
    # In llama-server's capitalization (clients that read headers as a plain dict find it).
    response.raw_headers.append((b"Process-Start-Time-Unix", str(int(m.t_start)).encode()))
    return response


async def embeddings(server: Server, request: Request) -> Response:
    raise ApiError(
        "This server does not support embeddings: localfab serve runs one model for "
        "generation (completion and chat)",
        "not_supported_error",
    )


async def rerank(server: Server, request: Request) -> Response:
    raise ApiError(
        "This server does not support reranking: localfab serve runs one model for "
        "generation (completion and chat)",
        "not_supported_error",
    )


async def models(server: Server, request: Request) -> Response:
    info = server.info
    assert info is not None
    return json_response(
        {
            "models": [
                {
                    "name": info.name,
                    "model": info.name,
                    "modified_at": "",
                    "size": "",
                    "digest": "",
                    "type": "model",
                    "description": "",
                    "tags": [""],
                    "capabilities": ["completion", "multimodal"] if info.vision else ["completion"],
                    "parameters": "",
                    "details": {
                        "parent_model": "",
                        "format": "gguf",
                        "family": "",
                        "families": [""],
                        "parameter_size": "",
                        "quantization_level": "",
                    },
                }
            ],
            "object": "list",
            "data": [
                {
                    "id": info.name,
                    "aliases": list(server.settings.aliases) or [info.name],
                    "tags": list(server.settings.tags),
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "llamacpp",
                    "meta": {
                        "vocab_type": info.vocab_type,
                        "n_vocab": info.n_vocab,
                        "n_ctx": info.n_ctx,
                        "n_ctx_train": info.n_ctx_train,
                        "n_embd": info.n_embd,
                        "n_params": info.n_params,
                        "size": info.size,
                        "ftype": info.ftype,
                    },
                }
            ],
        }
    )


async def tokenize(server: Server, request: Request) -> Response:
    body = await read_json(request, server.settings)
    if "content" not in body:
        return json_response({"tokens": []})
    add_special = boolean(body, "add_special", False)
    parse_special = boolean(body, "parse_special", True)
    with_pieces = boolean(body, "with_pieces", False)
    content = body["content"]
    if isinstance(content, str):
        tokens = await server.tokenize(
            content, add_special=add_special, parse_special=parse_special
        )
    elif isinstance(content, list):
        tokens = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                tokens += await server.tokenize(
                    part, add_special=add_special and i == 0, parse_special=parse_special
                )
            elif isinstance(part, int) and not isinstance(part, bool):
                tokens.append(part)
            else:
                raise ApiError(PROMPT_TYPES)
        check_tokens(tokens, server.model.engine.n_vocab)
    else:
        raise ApiError("Field 'content' must be a string or an array")
    if not with_pieces:
        return json_response({"tokens": tokens})

    def pieces(model: LoadedModel) -> list[dict[str, Any]]:
        out = []
        for tok in tokens:
            raw = model.engine.token_bytes(tok, special=True)
            try:
                piece: Any = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            out.append({"id": tok, "piece": piece})
        return out

    return json_response({"tokens": await asyncio.wrap_future(server.worker.call(pieces))})


async def detokenize(server: Server, request: Request) -> Response:
    body = await read_json(request, server.settings)
    tokens = body.get("tokens")
    if tokens is None:
        return json_response({"content": ""})
    if not isinstance(tokens, list):
        raise ApiError("'tokens' must be an array of token ids")
    check_tokens(tokens, server.model.engine.n_vocab)
    text = server.model.engine.detokenize(tokens, special=True)
    return json_response({"content": text})
