"""Thinking models: which tags a chat template thinks in, and a streaming split of a reply into
reasoning and answer.

A thinking model writes its reasoning in a block before the answer: `<think>` ... `</think>`
(Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3, Phi-4 reasoning), `<|START_THINKING|>` ...
`<|END_THINKING|>` (Command R7B), `[THINK]` ... `[/THINK]` (Magistral, Ministral reasoning).
Some templates open the block themselves at the end of the generation prompt (DeepSeek-R1
distills, QwQ, Qwen3 with thinking forced): the reply then starts inside it.

`ReasoningSplit` separates the two as text streams in, the way llama.cpp's parser does for
`--reasoning-format deepseek` (llama-server's `reasoning_content`): the tags are dropped, so is
whitespace right after the opening tag, right before the closing one and right after it (the
answer starts at its first visible character); a block of whitespace only is no reasoning. A tag
cut over two pieces of text is held back until it is whole, so every chunking of a reply splits
into the same two strings; a block never closed stays reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["reasoning", "content"]

# The tag pairs templates think in, in the order they are looked for.
TAG_PAIRS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("<|START_THINKING|>", "<|END_THINKING|>"),
    ("[THINK]", "[/THINK]"),
)


@dataclass(frozen=True)
class Thinking:
    """How a chat template thinks: its tags, whether its generation prompt opens the block,
    and whether it takes `enable_thinking` (to turn thinking off)."""

    start: str
    end: str
    opened_by_prompt: bool = False
    toggle: bool = False


def thinking_of(template: str | None, generation_prompt: str = "") -> Thinking | None:
    """The thinking of a chat template (None: it does not think). `generation_prompt` is the
    template rendered with `add_generation_prompt` (what the reply follows): when it ends with
    the opening tag, the reply starts inside the block."""
    if not template:
        return None
    for start, end in TAG_PAIRS:
        if end in template:
            opened = generation_prompt.rstrip().endswith(start)
            return Thinking(start, end, opened, "enable_thinking" in template)
    return None


class ReasoningSplit:
    """Feed a reply's text as it comes (`feed`), then `finish`; each returns the new pieces as
    (kind, text) pairs, adjacent pieces of one kind merged."""

    def __init__(self, thinking: Thinking) -> None:
        self.start, self.end = thinking.start, thinking.end
        # "before": the reply has not shown whether it opens a block; "reasoning", "content".
        self.state = "reasoning" if thinking.opened_by_prompt else "before"
        self._held = ""  # text not yet given out: a possible tag, or whitespace it may drop
        self._lead = True  # at the start of the current part: leading whitespace is dropped
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str) -> list[tuple[Kind, str]]:
        out: list[tuple[Kind, str]] = []
        self._held += text
        while self._held:
            if not self._step(out, final=False):
                break
        return _merged(out)

    def finish(self) -> list[tuple[Kind, str]]:
        """The end of the reply: what was held back, as what it is (an unclosed block stays
        reasoning; its trailing whitespace goes)."""
        out: list[tuple[Kind, str]] = []
        while self._held and self._step(out, final=True):
            pass
        if self._held and self.state == "content":
            self._give(out, "content", self._held)
        self._held = ""
        return _merged(out)

    # --- one step of the state machine: False when it must wait for more text --------------------

    def _step(self, out: list[tuple[Kind, str]], *, final: bool) -> bool:
        held = self._held
        if self._lead:
            held = held.lstrip()
            self._held = held
            if not held:
                return False
            self._lead = False
        if self.state == "before":
            if held.startswith(self.start):
                self._held = held[len(self.start) :]
                self.state, self._lead = "reasoning", True
                return True
            if self.start.startswith(held) and not final:
                return False  # maybe the opening tag, cut short
            self.state = "content"
            return True
        if self.state == "content":
            self._give(out, "content", held)
            self._held = ""
            return False
        return self._reasoning_step(out, held, final=final)

    def _reasoning_step(self, out: list[tuple[Kind, str]], held: str, *, final: bool) -> bool:
        at = held.find(self.end)
        if at >= 0:
            self._give(out, "reasoning", held[:at].rstrip())
            self._held = held[at + len(self.end) :]
            self.state, self._lead = "content", True
            return True
        # Give out all but what could still be the closing tag or whitespace before it.
        keep = _tail_that_may_start(held, self.end)
        body = held[: len(held) - keep]
        if final:  # an unclosed block: all of it is reasoning, a cut tag too
            self._give(out, "reasoning", held.rstrip())
            self._held = ""
            return False
        stripped = body.rstrip()
        self._give(out, "reasoning", stripped)
        self._held = held[len(stripped) :]
        return False

    def _give(self, out: list[tuple[Kind, str]], kind: Kind, text: str) -> None:
        if not text:
            return
        if kind == "reasoning":
            self.reasoning += text
        else:
            self.content += text
        out.append((kind, text))


def _tail_that_may_start(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def _merged(pieces: list[tuple[Kind, str]]) -> list[tuple[Kind, str]]:
    out: list[tuple[Kind, str]] = []
    for kind, text in pieces:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def split_reasoning(text: str, thinking: Thinking) -> tuple[str, str]:
    """A whole reply split at once: (reasoning, content)."""
    split = ReasoningSplit(thinking)
    split.feed(text)
    split.finish()
    return split.reasoning, split.content
