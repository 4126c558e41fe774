"""Handlers that generate: native `/completion`, OpenAI `/v1/completions` and
`/v1/chat/completions`, and `/apply-template`, which shares the chat's message handling.

Prompts take llama-server's forms (its tokenize_input_prompts): a string, token ids, strings and
ids mixed, `{"prompt_string": ...}`, or a list of those for several results in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from localfab.chat.messages import validate_messages
from localfab.chat.session import reply_room
from localfab.chat.tools import (
    ToolRequest,
    parse_tools,
    plan_tools,
    recipient_only,
    tool_messages,
)
from localfab.errors import UsageError
from localfab.server.chat_window import ChatWindow
from localfab.server.dialects import Chat, Completions, Dialect, Reasoning
from localfab.server.errors import ApiError, api_error
from localfab.server.media import chat_media, image_pins, multimodal_prompt, with_images
from localfab.server.params import Generation, number, parse_generation
from localfab.server.plumbing import json_response, read_json
from localfab.server.respond import MAX_RESULTS, Prompt, respond

if TYPE_CHECKING:
    from localfab.engine import Engine
    from localfab.server.state import Server

log = logging.getLogger("localfab.server")

PROMPT_TYPES = (
    '"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt '
    "string, or a list of mixed strings & tokens."
)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def split_prompts(prompt: Any) -> list[Any]:
    """llama-server's reading of `prompt`: an array holding no token id is several prompts;
    anything else is one."""
    if isinstance(prompt, list) and not any(_is_token(p) for p in prompt):
        if len(prompt) > MAX_RESULTS:
            raise ApiError(
                f"the request holds {len(prompt)} prompts; at most {MAX_RESULTS} are served "
                "per request: split it into several requests"
            )
        return prompt
    return [prompt]


def tokenize_prompt(engine: Engine, prompt: Any) -> list[int]:
    """One prompt's tokens: token ids as given, strings with BOS (if first) and special tokens.

    CPU work that grows with the prompt: call it from a thread."""
    if isinstance(prompt, dict) and prompt.get("multimodal_data"):
        return multimodal_prompt(engine, prompt)
    if isinstance(prompt, dict) and "prompt_string" in prompt:
        prompt = prompt["prompt_string"]
    if isinstance(prompt, str):
        return engine.tokenize(prompt, add_special=True, parse_special=True)
    if not isinstance(prompt, list):
        raise ApiError(PROMPT_TYPES)
    if not all(_is_token(p) or isinstance(p, str) for p in prompt):
        raise ApiError(PROMPT_TYPES)
    if prompt and not any(_is_token(p) for p in prompt):
        raise ApiError(PROMPT_TYPES)  # strings only, inside a list of prompts
    tokens: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            tokens += engine.tokenize(part, add_special=i == 0, parse_special=True)
        elif part < 0:  # never an image's id: it could name another request's image
            raise ApiError("Prompt contains invalid tokens")
        else:
            tokens.append(part)
    return tokens


def text_tokenizer(engine: Engine) -> Callable[[str], list[int]]:
    """Plain text to tokens (no BOS, special tokens as text): logit_bias keys, stop words."""
    return lambda text: engine.tokenize(text, add_special=False, parse_special=False)


def generation(server: Server, fields: Mapping[str, Any]) -> Generation:
    """A request's generation fields, with the model's tokenizer (logit_bias keys as text)
    and its end-of-generation tokens (banned by ignore_eos)."""
    engine = server.model.engine
    return parse_generation(
        fields, server.settings, tokenize=text_tokenizer(engine), eog=engine.eog_tokens()
    )


async def _completion(server: Server, request: Request, dialect_type: type[Dialect]) -> Response:
    body = await read_json(request, server.settings)
    engine = server.model.engine

    def prepare() -> tuple[Generation, list[Prompt]]:
        # Off the event loop: a JSON schema becomes a grammar, prompts become tokens.
        gen = generation(server, body)
        if "prompt" not in body:
            raise ApiError("[json.exception.out_of_range.403] key 'prompt' not found")
        parts = split_prompts(body["prompt"])
        return gen, [Prompt(tokenize_prompt(engine, p)) for p in parts]

    gen, prompts = await asyncio.to_thread(prepare)
    dialect = dialect_type(gen, server.prompt_text, verbose=server.verbose(gen))
    return await respond(server, request, prompts, gen, dialect)


async def completion(server: Server, request: Request) -> Response:
    return await _completion(server, request, Dialect)


async def completions_oai(server: Server, request: Request) -> Response:
    return await _completion(server, request, Completions)


async def chat_completions(server: Server, request: Request) -> Response:
    return await chat_reply(server, request, await read_json(request, server.settings))


async def chat_reply(
    server: Server, request: Request, body: dict[str, Any], dialect_type: type[Chat] = Chat
) -> Response:
    """An OpenAI chat completion of `body` (also what the other chat APIs are turned into, some
    with a dialect of their own that adds what they need)."""
    engine = server.model.engine
    n_ctx = engine.n_ctx
    shift = server.settings.context_shift

    def prepare() -> tuple[Generation, ChatWindow, ToolRequest | None]:
        # Templates, tokenizing and fitting are CPU work that grows with the conversation:
        # done in a thread, so the event loop keeps answering (/health, other streams).
        # Tokenizing only reads the vocabulary, which the engine thread never changes.
        fields = chat_to_completion_fields(body, jinja=server.settings.jinja)
        tools = request_tools(fields)
        gen = generation(server, fields)
        messages, _, prompt = chat_messages(server, fields, tools)
        window = ChatWindow(messages, prompt, n_ctx)
        if shift:  # without --context-shift a chat that does not fit is a 400, as llama-server
            window.fit(n_ctx - reply_room(n_ctx, gen.n_predict))
        return gen, window, tools

    gen, window, tools = await asyncio.to_thread(prepare)
    if window.shifted:
        log.info(
            "context full: %d oldest turn(s) and %d tool exchange(s) (%d tokens) left the window",
            window.left_out["turns"],
            window.left_out["exchanges"],
            window.left_out["tokens"],
        )
    reasoning = reasoning_split(server, body, window.tokens)
    if reasoning.thinking is not None:
        gen = replace(gen, thinking=reasoning.thinking, **reasoning_budget(server, body))
    if tools is not None:
        gen = await asyncio.to_thread(with_tools, server, gen, tools, reasoning)
    if gen.tools is None and not gen.sampling.grammar:
        gen = replace(gen, tools=recipient_only(server.model.prompts.template))
    dialect = dialect_type(
        gen, server.prompt_text, verbose=server.verbose(gen), reasoning=reasoning
    )
    return await respond(server, request, [Prompt(window.tokens, window)], gen, dialect)


async def chat_input_tokens(server: Server, request: Request) -> Response:
    """POST /chat/completions/input_tokens: a chat request's prompt tokens."""
    body = await read_json(request, server.settings)
    return json_response({"input_tokens": await count_chat_tokens(server, body)})


async def count_chat_tokens(server: Server, body: dict[str, Any]) -> int:
    """The tokens a chat request's prompt takes, as its template renders it (tools included)."""

    def count() -> int:
        fields = chat_to_completion_fields(body, jinja=server.settings.jinja)
        messages, _, tokens = chat_messages(server, fields, request_tools(fields))
        return len(tokens(messages))

    return await asyncio.to_thread(count)


REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


def request_tools(body: Mapping[str, Any]) -> ToolRequest | None:
    """The request's tools (None: none), as llama-server reads them; 400 when malformed."""
    try:
        tools = parse_tools(
            body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
        )
    except UsageError as exc:
        raise api_error(exc) from exc
    if tools is not None and tools.choice != "none" and "grammar" in body:
        raise ApiError("Cannot use custom grammar constraints with tools.")
    if tools is not None and body.get("stream") is True and body.get("logprobs") is True:
        raise ApiError("logprobs is not supported with tools + stream")
    return tools


def with_tools(
    server: Server, gen: Generation, tools: ToolRequest, reasoning: Reasoning
) -> Generation:
    """`gen` with the request's tool calls parsed and held to the tools' schemas by a grammar
    (lazy for `auto`). A request with a JSON schema of its own (`response_format`) gets a reply
    in that shape, which is content, as llama-server answers it. CPU work (the schemas become a
    grammar): call from a thread."""
    if gen.sampling.grammar or tools.choice == "none":
        return gen
    thinking = reasoning.thinking if reasoning.splits() else None
    try:
        end = thinking.end if thinking else ""
        lenient = server.settings.tool_call_lenient
        plan = plan_tools(tools, server.model.prompts.template, end, lenient=lenient)
    except UsageError as exc:
        raise api_error(exc) from exc
    return plan.onto(gen)


def reasoning_split(server: Server, body: Mapping[str, Any], tokens: Sequence[int]) -> Reasoning:
    """How this chat request's replies are split into reasoning and answer: the template's
    thinking (its generation prompt may open the block: the prompt's last tokens say) and the
    request's `reasoning_format` (default: --reasoning-format)."""
    fmt = body.get("reasoning_format", server.settings.reasoning_format)
    if fmt not in REASONING_FORMATS:
        raise ApiError(f"Unknown reasoning format: {fmt}")
    return Reasoning(server.model.prompts.thinking_after(tokens), fmt)


def reasoning_budget(server: Server, body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's reasoning budget as llama-server reads it: `reasoning_budget_tokens` (or
    `thinking_budget_tokens`; -1 or absent: --reasoning-budget) and `reasoning_budget_message`
    (absent: --reasoning-budget-message)."""
    settings = server.settings
    budget = number(
        body, "reasoning_budget_tokens", "thinking_budget_tokens", default=-1, integer=True
    )
    message = body.get("reasoning_budget_message", settings.reasoning_budget_message)
    if not isinstance(message, str):
        raise ApiError("reasoning_budget_message must be a string")
    return {
        "reasoning_budget": settings.reasoning_budget if budget == -1 else budget,
        "reasoning_budget_message": message,
    }


async def apply_template(server: Server, request: Request) -> Response:
    body = await read_json(request, server.settings)

    def apply() -> str:
        messages, render, _ = chat_messages(server, body, request_tools(body))
        return render(messages)

    return json_response({"prompt": await asyncio.to_thread(apply)})


Messages = list[dict[str, Any]]
Window = Sequence[Mapping[str, Any]]
_T = TypeVar("_T")


def chat_messages(
    server: Server, body: Mapping[str, Any], tools: ToolRequest | None = None
) -> tuple[Messages, Callable[[Window], str], Callable[[Window], list[int]]]:
    """The request's validated `messages`, and how to render (part of) them with the chat
    template, as text and as prompt tokens; a final assistant message is continued. `tools`
    go to the template (its `tools`), or, where it knows none, into the system message.

    The prompt tokens hold the template's control tokens, and each message's content as
    plain text: a message cannot forge a turn by spelling out `<|im_start|>system`. CPU
    work: call from a thread, not the event loop."""
    if "messages" not in body:
        raise ApiError("'messages' is required")
    if not isinstance(body["messages"], list):
        raise ApiError("Expected 'messages' to be an array")
    raw, images = chat_media(server, body["messages"])
    try:
        messages: Messages = list(validate_messages(raw))
    except UsageError as exc:
        raise api_error(exc) from exc
    pins = image_pins(server, messages, images)
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise ApiError("Field 'add_generation_prompt' must be a boolean")
    if body.get("continue_final_message") and add_generation_prompt:  # vLLM's explicit prefill
        raise ApiError("Cannot set both add_generation_prompt and continue_final_message to true.")
    messages = _prefill_parts(body["messages"], messages)
    prompts = server.model.prompts
    if [m["role"] for m in messages[-2:]] == ["assistant", "assistant"]:
        raise ApiError("Cannot have 2 or more assistant messages at the end of the list.")
    asked = body.get("chat_template_kwargs")
    if asked is not None and not isinstance(asked, dict):
        raise ApiError("Field 'chat_template_kwargs' must be an object")
    variables = server.settings.template_variables(asked)
    if tools is not None:
        before, messages = messages, tool_messages(prompts.template, messages, tools)
        pins.follow(before, messages)
        variables["tools"] = [dict(t) for t in tools.tools]

    def templated(apply: Callable[..., _T]) -> Callable[[Window], _T]:
        """`apply` (the template as text or as tokens) on a window; its errors are 400s."""

        def run(window: Window) -> _T:
            final = window[-1]["role"] == "assistant"
            try:
                return apply(
                    window,
                    continue_final=final,
                    add_generation_prompt=add_generation_prompt,
                    variables=variables,
                )
            except UsageError as exc:
                raise api_error(exc) from exc

        return run

    tokens = prompts.tokens if not pins else with_images(prompts.tokens, pins)
    return messages, templated(prompts.text), templated(tokens)


def _prefill_parts(raw: list[Any], messages: Messages) -> Messages:
    """A final assistant message in text parts, continued: its parts a blank line apart (as
    llama-server's continuation joins them; elsewhere they are a line apart)."""
    last = raw[-1] if raw else None
    if not (messages and messages[-1]["role"] == "assistant" and isinstance(last, dict)):
        return messages
    parts = last.get("content")
    if not isinstance(parts, list):
        return messages
    text = "\n\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return [*messages[:-1], {**messages[-1], "content": text}]


def chat_to_completion_fields(body: dict[str, Any], *, jinja: bool = True) -> dict[str, Any]:
    """OpenAI chat fields -> llama-server's completion fields (its oaicompat_chat_params_parse)."""
    body = dict(body)
    tools = body.get("tools")
    if not jinja and isinstance(tools, list) and tools:
        raise ApiError("tools param requires --jinja flag", "server_error")
    if not jinja and body.get("tool_choice") not in (None, "auto"):
        raise ApiError("tool_choice param requires --jinja flag", "server_error")
    if body.get("json_schema") is not None and body.get("grammar"):
        raise ApiError("Cannot use both json_schema and grammar")
    if "response_format" in body:
        _response_format(body)
    if body.get("logprobs") is True:
        top = body.get("top_logprobs")
        body["n_probs"] = 20 if top is None else top  # llama-server's default
    elif body.get("top_logprobs") is not None:
        raise ApiError("top_logprobs requires logprobs to be set to true")
    return body


def _response_format(body: dict[str, Any]) -> None:
    fmt = body["response_format"]
    if fmt is not None and not isinstance(fmt, dict):
        raise ApiError("Field 'response_format' must be an object")
    fmt = fmt or {}
    kind = fmt.get("type") or ""
    if not isinstance(kind, str):
        raise ApiError("Field 'response_format.type' must be a string")
    if kind == "json_object":
        if "schema" in fmt or not body.get("json_schema"):
            body["json_schema"] = fmt.get("schema") or {}
    elif kind == "json_schema":
        wrapper = fmt.get("json_schema") or {}
        if not isinstance(wrapper, dict):
            raise ApiError("Field 'response_format.json_schema' must be an object")
        body["json_schema"] = wrapper.get("schema") or {}
    elif kind and kind != "text":
        raise ApiError(
            'response_format type must be one of "text" or "json_object", but got: ' + kind
        )
