"""Turning messages into prompt tokens with the model's chat template.

Message contents (and an assistant's reasoning) are text, never control tokens: a user who
types `<start_of_turn>system` must not open a turn. So the template is rendered once with a
marker in place of each message's content (and reasoning); the template's own text between the
markers is tokenized with special tokens parsed, and each content without. Where the template
changes a content in a way that cannot be located (anything beyond trimming whitespace), the
whole text is tokenized, which is only allowed when no content holds a control token's text.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from localfab.chat.templates import ChatTemplate, resolve_template
from localfab.chat.thinking import template_thinking
from localfab.engine.reasoning import Thinking
from localfab.errors import UsageError

# Stands in for a message's content while rendering, to find where the content goes.
_MARK = "\x00localfab-content-{}\x00"
_MARKS = re.compile("\x00localfab-content-(\\d+)\x00")


class Tokenizer(Protocol):
    """What prompt building needs from an engine."""

    @property
    def add_bos(self) -> bool: ...
    @property
    def bos_token(self) -> int: ...
    @property
    def eos_token(self) -> int: ...

    def tokenize(
        self, text: str, *, add_special: bool = ..., parse_special: bool = ...
    ) -> list[int]: ...
    def token_text(self, token: int) -> str: ...
    def token_bytes(self, token: int, *, special: bool = ...) -> bytes: ...
    def chat_template(self) -> str | None: ...
    @property
    def architecture(self) -> str: ...


class PromptBuilder:
    """Renders messages with the model's template and tokenizes them, with exactly one BOS."""

    def __init__(
        self,
        engine: Tokenizer,
        template: ChatTemplate | None = None,
        *,
        source: str | None = None,
        name: str = "file",
    ) -> None:
        """`template`: a compiled one to use as is; `source`: a template's text to use with the
        model's BOS and EOS (--chat-template-file; `name`: a built-in's, for --chat-template
        chatml); neither: the model's own, or a built-in."""
        self.engine = engine
        if template is None:
            bos = engine.token_text(engine.bos_token) if engine.add_bos else ""
            eos = engine.token_text(engine.eos_token)
            if source is not None:
                template, notice = ChatTemplate(source, name, bos, eos), None
            else:
                template, notice = resolve_template(
                    engine.chat_template(), engine.architecture, bos_token=bos, eos_token=eos
                )
        else:
            notice = None
        self.template = template
        self.notice = notice
        # The template's own variables for every rendering that names none (a front end's
        # choice, such as enable_thinking for `run --reasoning off`).
        self.variables: dict[str, Any] = {}

    @classmethod
    def from_file(cls, engine: Tokenizer, path: Path) -> PromptBuilder:
        """A builder with the chat template in `path` instead of the model's (its BOS and EOS
        kept), as llama-server's --chat-template-file; UsageError when it cannot be read."""
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the chat template file {path}: {exc}") from exc
        return cls(engine, source=source)

    def text(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        continue_final: bool = False,
        add_generation_prompt: bool | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The conversation as the template renders it (`variables`: its own, such as
        enable_thinking)."""
        if add_generation_prompt is None:
            add_generation_prompt = not continue_final
        return self.template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final=continue_final,
            variables=self.variables if variables is None else variables,
        )

    def tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        continue_final: bool = False,
        add_generation_prompt: bool | None = None,
        pinned: Mapping[int, Sequence[int]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """Prompt tokens of `messages`: the template's text with its control tokens, each
        message's content as plain text.

        `pinned` maps a message's index to the tokens its content already has (a reply as the
        model generated it, which can differ from how the tokenizer would split the same text).
        Those tokens are used as they are where the template places that content exactly once,
        so the prompt matches the KV cache token for token and the next turn reuses the whole
        conversation.
        """

        def render(msgs: Sequence[Mapping[str, Any]]) -> str:
            return self.text(
                msgs,
                continue_final=continue_final,
                add_generation_prompt=add_generation_prompt,
                variables=variables,
            )

        text = render(messages)
        skeleton = render(_marked(messages))
        layout = self._layout(messages, skeleton, text)
        tokens = None if layout is None else self._assemble(messages, *layout, pinned or {})
        if tokens is None:
            return self._whole(messages, text)
        return tokens

    @staticmethod
    def _layout(
        messages: Sequence[Mapping[str, Any]], skeleton: str, text: str
    ) -> tuple[list[str], list[int], list[str]] | None:
        """The template's text around each placed content (fragments), which message each
        content is, and the content as placed (the template may trim it); None where the
        rendered text is not the fragments and the contents in turn."""
        parts = _MARKS.split(skeleton)
        fragments = parts[0::2]
        order = [int(i) for i in parts[1::2]]
        if any(i >= 2 * len(messages) for i in order) or not text.startswith(fragments[0]):
            return None
        placed: list[str] = []
        pos = len(fragments[0])
        for k, i in enumerate(order):
            content = _text_of(messages, i)
            after = fragments[k + 1]
            last = k == len(order) - 1
            variants = (content, content.strip(), content.lstrip(), content.rstrip())
            for shown in dict.fromkeys(variants):
                end = pos + len(shown)
                if (
                    text.startswith(shown, pos)
                    and text.startswith(after, end)
                    and (not last or end + len(after) == len(text))
                ):
                    break
            else:
                return None
            placed.append(shown)
            pos = end + len(after)
        if pos != len(text):
            return None
        return fragments, order, placed

    def _assemble(
        self,
        messages: Sequence[Mapping[str, Any]],
        fragments: list[str],
        order: list[int],
        placed: list[str],
        pinned: Mapping[int, Sequence[int]],
    ) -> list[int] | None:
        tokenize = self.engine.tokenize
        known: dict[str, list[int] | None] = {}
        times = Counter(order)
        out = self.encode(fragments[0])
        for k, (i, shown) in enumerate(zip(order, placed, strict=True)):
            span = None
            if i in pinned and times[i] == 1:
                # Pinned tokens spell their content (checked when they were pinned); where the
                # template trims the content, only whitespace-only tokens at the ends may go.
                span = list(pinned[i])
                if shown != _text_of(messages, i):
                    span = self._trim(span, shown)
            if span is None:
                span = tokenize(shown, add_special=False, parse_special=False)
                # A tokenizer that adds text on its own at the start of a text (a space prefix,
                # say) would put text in the prompt that the template did not: then the whole
                # text is tokenized. Only the start can differ, so unless the content starts
                # with whitespace (which could hide an added space), the first token tells.
                head = span if shown[:1].isspace() else span[:1]
                if not shown.encode().startswith(self.spelled(head)) or bool(shown) != bool(span):
                    return None
            out.extend(span)
            fragment = fragments[k + 1]
            if fragment not in known:
                piece = tokenize(fragment, add_special=False, parse_special=True)
                known[fragment] = piece if self.spelled(piece) == fragment.encode() else None
            known_piece = known[fragment]
            if known_piece is None:
                return None
            out.extend(known_piece)
        return out

    def _whole(self, messages: Sequence[Mapping[str, Any]], text: str) -> list[int]:
        """The whole rendered text tokenized at once, if no content holds control tokens."""
        tokenize = self.engine.tokenize
        for i in range(2 * len(messages)):
            content = _text_of(messages, i)
            plain = tokenize(content, add_special=False, parse_special=False)
            if tokenize(content, add_special=False, parse_special=True) != plain:
                i %= len(messages)
                raise UsageError(
                    f"message {i} contains the text of a control token, which this chat "
                    "template would turn into a real one: remove it from the message"
                )
        return self.encode(text)

    def set_thinking(self, mode: str) -> None:
        """Thinking "on" or "off" through the template's enable_thinking ("auto": the
        template's default) for every rendering from now on."""
        if mode == "auto":
            self.variables.pop("enable_thinking", None)
        else:
            self.variables["enable_thinking"] = mode == "on"

    def thinking_after(self, tokens: Sequence[int]) -> Thinking | None:
        """How a reply after `tokens` (a prompt this builder made) thinks: the template's tags,
        and whether the prompt's end opened the block (None: the template does not think)."""
        tail = self.spelled(tokens[-8:]).decode("utf-8", errors="replace")
        return template_thinking(self.template, tail)

    def spelled(self, tokens: Sequence[int]) -> bytes:
        """The exact bytes `tokens` stand for, control tokens as their text (no detokenizer
        clean-up such as dropping a leading space)."""
        return b"".join(self.engine.token_bytes(t, special=True) for t in tokens)

    def _trim(self, tokens: list[int], content: str) -> list[int] | None:
        """`tokens` without whitespace-only tokens at the ends, if what is left is `content`."""
        while tokens and not self.spelled(tokens[:1]).strip():
            tokens = tokens[1:]
        while tokens and not self.spelled(tokens[-1:]).strip():
            tokens = tokens[:-1]
        return tokens if self.spelled(tokens) == content.encode() else None

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered template text: special tokens parsed, one BOS if the model wants it."""
        tokens = self.engine.tokenize(text, add_special=False, parse_special=True)
        if self.engine.add_bos and (not tokens or tokens[0] != self.engine.bos_token):
            tokens.insert(0, self.engine.bos_token)
        return tokens

    def holds_control_text(self, text: str) -> bool:
        """Whether `text`, tokenized as template text is, would hold a control token."""
        tokenize = self.engine.tokenize
        plain = tokenize(text, add_special=False, parse_special=False)
        return tokenize(text, add_special=False, parse_special=True) != plain

    def raw(self, text: str) -> list[int]:
        """Tokenize plain text with no template (BOS added as the model asks)."""
        return self.engine.tokenize(text, add_special=True, parse_special=False)


def _marked(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages with a marker for each content, and for each reasoning (numbered after
    the contents): what the template writes of either is found in its text by these."""
    n = len(messages)
    out = []
    for i, m in enumerate(messages):
        marked = {**m, "content": _MARK.format(i)}
        if m.get("reasoning_content"):
            marked["reasoning_content"] = _MARK.format(n + i)
        out.append(marked)
    return out


def _text_of(messages: Sequence[Mapping[str, Any]], i: int) -> str:
    """Text number `i` of the messages: a content, or (past the contents) a reasoning."""
    n = len(messages)
    if i < n:
        return str(messages[i].get("content"))
    return str(messages[i - n].get("reasoning_content") or "")
