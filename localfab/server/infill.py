"""`POST /infill`: fill-in-the-middle for editor completion plugins, as llama-server serves it.

The prompt is llama-server's `format_prompt_infill` (tools/server/server-common.cpp), token for
token: the repository context (`input_extra`: files the editor sends, each `{filename, text}`)
first, behind the model's repo and file-separator tokens where it has them, then
`<FIM_PRE> prefix prompt <FIM_SUF> suffix <FIM_MID>`; prefix, suffix and context are cut to
llama-server's budget (the end of the prefix, the start of the suffix, the end of the context).
The answer is `/completion`'s, streamed or not. A model without FIM tokens is llama-server's
501 `not_supported_error`, naming the tokens it lacks.

Where llama-server answers bad input with a 500 or ignores it (a `prompt` that is not a string,
a missing `input_prefix` or `input_suffix`), this is a 400 that says what is wrong.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from localfab.server.completions import generation
from localfab.server.dialects import Dialect
from localfab.server.errors import ApiError
from localfab.server.params import Generation
from localfab.server.plumbing import read_json
from localfab.server.respond import Prompt, respond

if TYPE_CHECKING:
    from localfab.engine import Engine
    from localfab.server.state import Server

EXTRA_TYPE = '"input_extra" must be an array of {"filename": string, "text": string}'
CHUNK_TEXT = 'extra_context chunk must contain a "text" field with a string value'
CHUNK_NAME = 'extra_context chunk\'s "filename" field must be a string'
SNIPPET = "\n\n--- snippet ---\n\n"  # between context chunks of a model without a file separator


def missing_fim(fim: dict[str, int]) -> str:
    """llama-server's list of the FIM tokens a model lacks ('' when it has all three)."""
    names = (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))
    return "".join(f"{word} token is missing. " for key, word in names if key not in fim)


def check_fields(body: dict[str, Any]) -> list[dict[str, str]]:
    """The request's infill fields checked (400 on a wrong one); returns the context chunks."""
    if not isinstance(body.get("prompt", ""), str):
        raise ApiError('"prompt" must be a string')
    for field in ("input_prefix", "input_suffix"):
        if field not in body:
            raise ApiError(f'"{field}" is required')
        if not isinstance(body[field], str | list):
            raise ApiError(f'"{field}" must be a string or a list of strings and token ids')
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise ApiError(EXTRA_TYPE)
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(CHUNK_TEXT)
        if not isinstance(chunk.get("filename", ""), str):
            raise ApiError(CHUNK_NAME)
    return extra


def _mixed(engine: Engine, value: str | list[Any]) -> list[int]:
    """A prefix or suffix: text, or text and token ids mixed (llama-server's tokenize_mixed)."""
    parts = [value] if isinstance(value, str) else value
    tokens: list[int] = []
    for part in parts:
        if isinstance(part, str):
            tokens += engine.tokenize(part, add_special=False, parse_special=False)
        elif isinstance(part, int) and not isinstance(part, bool):
            tokens.append(part)
        else:
            raise ApiError('"input_prefix" and "input_suffix" hold strings and token ids only')
    return tokens


def repo_context(engine: Engine, fim: dict[str, int], extra: list[dict[str, str]]) -> list[int]:
    """The context tokens before the FIM prompt: the repo name, each file, the file to fill."""

    def text(s: str) -> list[int]:
        return engine.tokenize(s, add_special=False, parse_special=False)

    tokens: list[int] = []
    if "rep" in fim:
        tokens += [fim["rep"], *text("myproject\n")]
    for chunk in extra:
        if "sep" in fim:
            tokens += [fim["sep"], *text(chunk.get("filename", "tmp") + "\n")]
        else:
            tokens += text(SNIPPET)
        tokens += text(chunk["text"])
    if "sep" in fim:
        tokens += [fim["sep"], *text("filename\n")]
    return tokens


def infill_prompt(
    server: Server, body: dict[str, Any], fim: dict[str, int], extra: list[dict[str, str]]
) -> list[int]:
    """The whole prompt's tokens, within llama-server's budget for each part."""
    engine = server.model.engine
    prefix = _mixed(engine, body["input_prefix"])
    suffix = _mixed(engine, body["input_suffix"])
    prompt = engine.tokenize(body.get("prompt", ""), add_special=False, parse_special=True)
    context = repo_context(engine, fim, extra)
    n_batch, n_predict = engine.n_batch, server.settings.n_predict
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_context = min(max(0, server.slot_n_ctx - n_batch - 2 * n_predict), len(context))
    pre = [fim["pre"], *prefix[len(prefix) - n_prefix :], *prompt]
    suf = [fim["suf"], *suffix[:n_suffix]]
    first, second = (suf, pre) if server.settings.spm_infill else (pre, suf)
    if engine.add_bos:
        first = [engine.bos_token, *first]
    return [*context[len(context) - n_context :], *first, *second, fim["mid"]]


async def infill(server: Server, request: Request) -> Response:
    engine = server.model.engine
    fim = engine.fim_tokens()
    missing = missing_fim(fim)
    if missing:  # before the body is read, as llama-server
        raise ApiError(f"Infill is not supported by this model: {missing}", "not_supported_error")
    body = await read_json(request, server.settings)

    def prepare() -> tuple[Generation, list[int]]:
        extra = check_fields(body)
        gen = generation(server, body)
        return gen, infill_prompt(server, body, fim, extra)

    gen, tokens = await asyncio.to_thread(prepare)
    dialect = Dialect(gen, server.prompt_text, verbose=server.verbose(gen))
    return await respond(server, request, [Prompt(tokens)], gen, dialect)
