"""llama.cpp's built-in chat formats by name (`--chat-template command-r`), as a `ChatTemplate`.

llama-server renders a template name it knows with llama.cpp's own C++ formats; the same code
renders them here (`engine.legacy_chat`). They take each message's role and text: text parts
joined by a newline, as llama.cpp joins them, and nothing else (no tools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from localfab.chat.templates import BUILTIN_TEMPLATES, ChatTemplate
from localfab.engine import legacy_chat

# C strings end at NUL: one inside a text (a continuation mark) travels as this character.
_NUL_STAND_IN = "\U000f0000"


@dataclass(frozen=True)
class LegacyTemplate(ChatTemplate):
    """One of llama.cpp's built-in formats; `source` and `name` are its name."""

    def _render_once(
        self,
        msgs: list[dict[str, Any]],
        add_generation_prompt: bool,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        pairs = [
            (str(m.get("role") or ""), _text(m.get("content")).replace("\0", _NUL_STAND_IN))
            for m in msgs
        ]
        text = legacy_chat.render(self.name, pairs, add_generation_prompt)
        return text.replace(_NUL_STAND_IN, "\0")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text") or "")
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return "" if content is None else str(content)


def legacy_template(name: str) -> LegacyTemplate | None:
    """llama.cpp's C++ format called `name` (command-r, mistral-v7, ...); None when llama.cpp
    knows no such name. The Jinja built-ins (chatml, llama3, gemma, phi3) come first."""
    if name in BUILTIN_TEMPLATES or name not in legacy_chat.builtin_names():
        return None
    return LegacyTemplate(name, name)
