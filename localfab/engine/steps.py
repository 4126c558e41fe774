"""The end of a reply for the text steps that ride on it (a thinking model's split, a reply's
tool calls), shared by the local token step (`reply.ReplyState`) and a remote server's reply
(`localfab.remote.reply`): what they held back, and the `Done` with the reply split."""

from __future__ import annotations

from dataclasses import replace

from localfab.engine.callsyntax import CallDelta
from localfab.engine.thought import ThoughtStep
from localfab.engine.toolcalls import ToolStep
from localfab.engine.types import Done

Parts = tuple[tuple[str, str], ...]


def held_back(
    thought: ThoughtStep | None, tools: ToolStep | None, tail: str
) -> tuple[Parts | None, tuple[CallDelta, ...]]:
    """The pieces of reasoning and answer, and the call deltas, the steps still held at the end
    (`tail`: the text held back to the end); (None, ()) without steps."""
    parts: Parts | None = None
    if thought is not None:
        parts = thought.finish(tail)
    calls: tuple[CallDelta, ...] = ()
    if tools is not None:
        if parts is None:
            parts = (("content", tail),) if tail else ()
        parts, calls = tools.take(parts, final=True)
    return parts, calls


def split_done(done: Done, thought: ThoughtStep | None, tools: ToolStep | None) -> Done:
    """`done` with the reply's reasoning and answer apart, and its tool calls."""
    if thought is not None:
        split = thought.split
        done = replace(
            done,
            reasoning=split.reasoning,
            content=split.content,
            reasoning_tokens=thought.n_reasoning,
            budget_hit=thought.budget_hit,
            in_reasoning=split.state == "reasoning",
        )
    if tools is not None:
        parser = tools.parser
        done = replace(done, content=parser.content, tool_calls=tuple(parser.calls))
    return done
