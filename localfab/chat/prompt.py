"""Turning messages into prompt tokens with the model's chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from localfab.templates import ChatTemplate, resolve_template

# Stands in for a pinned message's content while rendering, to find where the content goes.
_MARK = "\x00localfab-pinned-{}\x00"


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

    def __init__(self, engine: Tokenizer, template: ChatTemplate | None = None) -> None:
        self.engine = engine
        if template is None:
            template, notice = resolve_template(
                engine.chat_template(),
                engine.architecture,
                bos_token=engine.token_text(engine.bos_token) if engine.add_bos else "",
                eos_token=engine.token_text(engine.eos_token),
            )
        else:
            notice = None
        self.template = template
        self.notice = notice

    def text(self, messages: Sequence[Mapping[str, Any]], *, continue_final: bool = False) -> str:
        return self.template.render(
            messages, add_generation_prompt=not continue_final, continue_final=continue_final
        )

    def tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        continue_final: bool = False,
        pinned: Mapping[int, Sequence[int]] | None = None,
    ) -> list[int]:
        """Prompt tokens of `messages`.

        `pinned` maps a message's index to the tokens its content already has (a reply as the
        model generated it, which can differ from how the tokenizer would split the same text).
        Those tokens are used as they are, so the prompt matches the KV cache token for token
        and the next turn reuses the whole conversation. Where the template does not place a
        pinned content verbatim and exactly once, the whole text is tokenized instead.
        """
        text = self.text(messages, continue_final=continue_final)
        if pinned:
            spliced = self._splice(messages, text, pinned, continue_final)
            if spliced is not None:
                return spliced
        return self.encode(text)

    def _splice(
        self,
        messages: Sequence[Mapping[str, Any]],
        text: str,
        pinned: Mapping[int, Sequence[int]],
        continue_final: bool,
    ) -> list[int] | None:
        order = sorted(i for i in pinned if 0 <= i < len(messages))
        if not order:
            return None
        marked = [
            {**m, "content": _MARK.format(i)} if i in pinned else m for i, m in enumerate(messages)
        ]
        skeleton = self.text(marked, continue_final=continue_final)
        fragments: list[str] = []
        pos = 0
        for i in order:
            mark = _MARK.format(i)
            at = skeleton.find(mark, pos)
            if at < 0 or skeleton.find(mark, at + len(mark)) >= 0:
                return None
            fragments.append(skeleton[pos:at])
            pos = at + len(mark)
        fragments.append(skeleton[pos:])
        contents = [str(messages[i].get("content", "")) for i in order]
        spans = [list(pinned[i]) for i in order]
        if self._rebuild(fragments, contents) != text:
            # Templates often trim messages (Gemma's does): whitespace-only tokens at either end
            # of a reply can go; whitespace inside a token cannot, nor any other change.
            contents = [c.strip() for c in contents]
            if self._rebuild(fragments, contents) != text:
                return None
            trimmed = [self._trim(span, c) for span, c in zip(spans, contents, strict=True)]
            if any(span is None for span in trimmed):
                return None
            spans = trimmed  # type: ignore[assignment]
        out = self.encode(fragments[0])
        for span, fragment in zip(spans, fragments[1:], strict=True):
            out.extend(span)
            if fragment:
                piece = self.engine.tokenize(fragment, add_special=False, parse_special=True)
                # A tokenizer that changes a fragment on its own (a space prefix, say) would put
                # text in the prompt that the template did not: then tokenize the whole text.
                if self.spelled(piece) != fragment.encode():
                    return None
                out.extend(piece)
        return out

    def spelled(self, tokens: Sequence[int]) -> bytes:
        """The exact bytes `tokens` stand for, control tokens as their text (no detokenizer
        clean-up such as dropping a leading space)."""
        return b"".join(self.engine.token_bytes(t, special=True) for t in tokens)

    @staticmethod
    def _rebuild(fragments: list[str], contents: list[str]) -> str:
        tail = zip(contents, fragments[1:], strict=True)
        return fragments[0] + "".join(content + after for content, after in tail)

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

    def raw(self, text: str) -> list[int]:
        """Tokenize plain text with no template (BOS added as the model asks)."""
        return self.engine.tokenize(text, add_special=True, parse_special=False)
