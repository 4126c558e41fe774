"""Turning messages into prompt tokens with the model's chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from localfab.templates import ChatTemplate, resolve_template


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
        self, messages: Sequence[Mapping[str, Any]], *, continue_final: bool = False
    ) -> list[int]:
        return self.encode(self.text(messages, continue_final=continue_final))

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered template text: special tokens parsed, one BOS if the model wants it."""
        tokens = self.engine.tokenize(text, add_special=False, parse_special=True)
        if self.engine.add_bos and (not tokens or tokens[0] != self.engine.bos_token):
            tokens.insert(0, self.engine.bos_token)
        return tokens

    def raw(self, text: str) -> list[int]:
        """Tokenize plain text with no template (BOS added as the model asks)."""
        return self.engine.tokenize(text, add_special=True, parse_special=False)
