"""Thinking models: which tags a chat template thinks in, and a streaming split of a reply into
reasoning and answer.

A thinking model writes its reasoning in a block before the answer: `<think>` ... `</think>`
(Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3, Phi-4 reasoning), `<|START_THINKING|>` ...
`<|END_THINKING|>` (Command R7B), `[THINK]` ... `[/THINK]` (Magistral, Ministral reasoning).
Some templates open the block themselves at the end of the generation prompt (DeepSeek-R1
distills, QwQ, Qwen3 with thinking forced): the reply then starts inside it.

`ReasoningSplit` separates the two as text streams in, the way llama-server of this llama.cpp
puts a reply into `reasoning_content` and `content` (checked against the binary, see the
tests): the tags go; so does the whitespace the template itself writes after each tag (Qwen3:
one newline after `<think>`, two after `</think>`), and, where the reply may open a block,
whitespace before it; a block of whitespace only is no reasoning. Where the prompt opened the
block, what the prompt wrote after the tag (DeepSeek-R1's newline) starts the reasoning, as in
llama-server, unless the template writes the same after the tag in a reply it renders. A tag
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
    """How a chat template thinks: its tags, whether its generation prompt opens the block
    (and what it writes after the tag there), whether it takes `enable_thinking`, and the
    whitespace it writes after each tag in a reply it renders (dropped when parsing)."""

    start: str
    end: str
    opened_by_prompt: bool = False
    toggle: bool = False
    start_gap: str = ""
    end_gap: str = ""
    prompt_tail: str = ""  # the generation prompt after its opening tag


def thinking_of(
    template: str | None, generation_prompt: str = "", probe: str = ""
) -> Thinking | None:
    """The thinking of a chat template (None: it does not think). `generation_prompt` is the
    template rendered with `add_generation_prompt` (what the reply follows; when the opening
    tag is in its last line, the reply starts inside the block); `probe` is the template's
    rendering of a reply with reasoning `PROBE_REASONING` and content `PROBE_CONTENT`, where
    the whitespace it puts after each tag is read."""
    if not template:
        return None
    for start, end in TAG_PAIRS:
        if end not in template:
            continue
        at = generation_prompt.rfind(start)
        tail = generation_prompt[at + len(start) :] if at >= 0 else ""
        opened = at >= 0 and not tail.strip() and end not in tail
        return Thinking(
            start,
            end,
            opened_by_prompt=opened,
            toggle="enable_thinking" in template,
            start_gap=_gap(probe, start, PROBE_REASONING),
            end_gap=_gap(probe, end, PROBE_CONTENT),
            prompt_tail=tail if opened else "",
        )
    return None


PROBE_REASONING = "R3AS0N1NG"
PROBE_CONTENT = "C0NT3NT"


def _gap(probe: str, tag: str, after: str) -> str:
    """The whitespace between `tag` and `after` in `probe` ("" where they are not so)."""
    at = probe.find(tag)
    if at < 0:
        return ""
    rest = probe[at + len(tag) :]
    gap = rest[: len(rest) - len(rest.lstrip())]
    return gap if rest[len(gap) :].startswith(after) else ""


class ReasoningSplit:
    """Feed a reply's text as it comes (`feed`), then `finish`; each returns the new pieces as
    (kind, text) pairs, adjacent pieces of one kind merged."""

    def __init__(self, thinking: Thinking) -> None:
        self.thinking = thinking
        self.start, self.end = thinking.start, thinking.end
        # "before": the reply has not shown whether it opens a block; "reasoning", "content".
        self.state = "reasoning" if thinking.opened_by_prompt else "before"
        # What the prompt wrote after the tag it opened begins the reasoning (DeepSeek-R1's
        # newline), unless it is the whitespace the template itself writes after that tag.
        tail = thinking.prompt_tail
        self._held = tail if thinking.opened_by_prompt and tail != thinking.start_gap else ""
        self._gap = ""  # the whitespace the template writes after the last tag, still to drop
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str) -> list[tuple[Kind, str]]:
        out: list[tuple[Kind, str]] = []
        self._held += text
        while self._held and self._step(out, final=False):
            pass
        return merged(out)

    def finish(self) -> list[tuple[Kind, str]]:
        """The end of the reply: what was held back, as what it is (an unclosed block stays
        reasoning, a cut tag with it)."""
        out: list[tuple[Kind, str]] = []
        while self._held and self._step(out, final=True):
            pass
        if self._held:
            if self.state == "content":
                self._give(out, "content", self._held)
            elif self.reasoning or self._held.strip():
                self._give(out, "reasoning", self._held)
        self._held = ""
        return merged(out)

    # --- one step of the state machine: False when it must wait for more text --------------------

    def _step(self, out: list[tuple[Kind, str]], *, final: bool) -> bool:
        if not self._skip_gap(final=final):
            return False
        held = self._held
        if self.state == "before":
            held = self._held = held.lstrip()
            if not held:
                return False
            if held.startswith(self.start):
                self._held = held[len(self.start) :]
                self.state, self._gap = "reasoning", self.thinking.start_gap
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

    def _skip_gap(self, *, final: bool) -> bool:
        """Drop what of the template's whitespace after the last tag the text begins with;
        False while the text so far is all of it (more may follow)."""
        gap, held = self._gap, self._held
        n = 0
        while n < len(gap) and n < len(held) and held[n] == gap[n]:
            n += 1
        self._held = held[n:]
        self._gap = gap[n:] if n == len(held) and not final else ""
        return bool(self._held)

    def _reasoning_step(self, out: list[tuple[Kind, str]], held: str, *, final: bool) -> bool:
        at = held.find(self.end)
        if at >= 0:
            body = held[:at]
            if self.reasoning or body.strip():  # a block of whitespace only is no reasoning
                self._give(out, "reasoning", body)
            self._held = held[at + len(self.end) :]
            self.state, self._gap = "content", self.thinking.end_gap
            return True
        if final:
            return False  # `finish` gives what is left
        # Give out all but what could still be the closing tag, once the block is more than
        # whitespace.
        keep = _tail_that_may_start(held, self.end)
        body = held[: len(held) - keep]
        if self.reasoning or body.strip():
            self._give(out, "reasoning", body)
            self._held = held[len(body) :]
        return False

    def _give(self, out: list[tuple[Kind, str]], kind: Kind, text: str) -> None:
        if not text:
            return
        if kind == "reasoning":
            self.reasoning += text
        else:
            self.content += text
        out.append((kind, text))


class Unsplit:
    """A thinking model's reply left whole (reasoning_format "none"), as llama-server gives it:
    after what the prompt opened (its tag and what followed it), leading whitespace dropped."""

    def __init__(self, thinking: Thinking) -> None:
        self._pending = thinking.start + thinking.prompt_tail if thinking.opened_by_prompt else ""
        self._started = False

    def feed(self, text: str) -> str:
        text, self._pending = self._pending + text, ""
        if not self._started:
            text = text.lstrip()
            self._started = bool(text)
        return text


def _tail_that_may_start(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a beginning of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def merged(pieces: list[tuple[Kind, str]]) -> list[tuple[Kind, str]]:
    out: list[tuple[Kind, str]] = []
    for kind, text in pieces:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out
