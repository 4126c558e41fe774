"""`localfab run --tools FILE.json`: a one-shot prompt with tools, for scripts.

The tools go to the model's chat template (where it knows none, they are described in the system
prompt, as the server does), the reply's calls are parsed from the model's own syntax and held
to the tools' schemas by a grammar (`--tool-choice`), and each call is printed after the reply's
text as one JSON line, `{"name": ..., "arguments": {...}}` (or in `tool_calls` with `--json`).
A reply that is only a bare JSON call of an offered tool (as small models write them, without
their template's markers) is a call too (`engine.loosecalls`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localfab.errors import UsageError

if TYPE_CHECKING:
    from localfab.chat.events import Reply
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.tools import ToolRequest
    from localfab.engine.types import GenerationOptions


def tools_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--tool-choice",
        default="auto",
        show_default=True,
        help="With --tools: auto (the model decides), none, required (a call, held to the "
        "schemas), or a tool's name (a call of that tool).",
    )(f)
    return click.option(
        "--tools",
        "tools_file",
        type=click.Path(dir_okay=False),
        default=None,
        help='A JSON file of OpenAI-style tools (a list, or {"tools": [...]}): the reply\'s '
        "calls are printed as JSON lines after its text.",
    )(f)


def load_tools(tools_file: str | None, tool_choice: str, *, raw: bool) -> ToolRequest | None:
    """The tools in `--tools` (None without it) with `--tool-choice`; a UsageError that says
    what is wrong."""
    from localfab.chat.tools import parse_tools

    if tools_file is None:
        return None
    if raw:
        raise UsageError("--tools needs the chat template: leave out --raw")
    path, choice = tools_file, tool_choice
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--tools: {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--tools: {path} cannot be read: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"--tools: {path} is not JSON ({exc})") from None
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    asked: Any = choice
    if choice not in ("auto", "none", "required"):
        asked = {"type": "function", "function": {"name": choice}}
    try:
        request = parse_tools(data, asked)
    except UsageError as exc:
        raise UsageError(f"--tools {path}: {exc}") from None
    if request is None:
        raise UsageError(f"--tools: {path} holds no tools")
    return request


def use_tools(
    request: ToolRequest | None,
    prompts: PromptBuilder,
    system: str | None,
    options: GenerationOptions,
    continues: int,
) -> tuple[str | None, GenerationOptions, int]:
    """The system prompt (with the tools described, where the template shows none), the
    options (the parser, and the grammar `--tool-choice` asks for) and the continuations (none:
    a call cut at the limit is not continued) of a reply with `request`'s tools; the template
    gets the tools from here on. Without tools, all as they are."""
    from localfab.chat.thinking import template_thinking
    from localfab.chat.tools import plan_tools, tool_messages

    if request is None:
        return system, options, continues

    template = prompts.template
    head = [{"role": "system", "content": system}] if system else []
    shown = tool_messages(template, head, request)
    if shown and shown[0]["role"] == "system":
        system = str(shown[0]["content"])
    prompts.variables["tools"] = [dict(t) for t in request.tools]
    if request.choice == "none":
        return system, options, 0
    thinking = template_thinking(template, "")
    plan = plan_tools(request, template, thinking.end if thinking else "", lenient=True)
    return system, plan.onto(options), 0


def reply_calls(reply: Reply, request: ToolRequest | None) -> list[dict[str, Any]] | None:
    """The reply's calls, each as {"name", "arguments"} (the arguments parsed where they are
    JSON, as the model wrote them otherwise); None without tools."""
    if request is None:
        return None
    calls = reply.pieces[-1].tool_calls if reply.pieces else None
    out = []
    for call in calls or ():
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = call.arguments
        out.append({"name": call.name, "arguments": arguments})
    return out
