"""A tool's result as the model reads it and as a person sees it, cut to a budget.

An MCP result is a list of content blocks (text, images, audio, embedded resources, links)
and, from newer servers, `structured_content`. The model gets text: text blocks as they are,
structured content as JSON where there is no text, and a one-line stand-in for what it cannot
read (an image, audio, a binary resource). A result larger than the chat can hold is cut, and
the model is told so in the text itself, so it does not take a cut listing for the whole.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

# The most characters a result may hand to the model when the caller sets no budget
# (a chat cuts further to what its window holds).
MAX_RESULT_CHARS = 64_000


@dataclass(frozen=True)
class ToolOutcome:
    """What one call came to: `text` for the model (and the card), whether it failed, and how
    the text was cut (`full_chars`: its length before; 0 when not cut)."""

    text: str
    is_error: bool = False
    full_chars: int = 0
    # "result", "error" (the tool said it failed), "denied", "timeout", "cancelled", "crashed"
    kind: str = "result"

    @property
    def cut(self) -> bool:
        return self.full_chars > 0


def result_text(content: list[Any], structured: dict[str, Any] | None) -> str:
    """The model's text for a result's content blocks (pydantic models or plain dicts)."""
    parts = [_block_text(_as_dict(block)) for block in content]
    texts = [p for p in parts if p]
    if structured is not None and not any(_as_dict(b).get("type") == "text" for b in content):
        texts.append(json.dumps(structured, ensure_ascii=False, indent=2))
    return "\n".join(texts)


def _as_dict(block: Any) -> dict[str, Any]:
    if isinstance(block, dict):
        return block
    dump = getattr(block, "model_dump", None)
    return dump(by_alias=True) if callable(dump) else {"type": "text", "text": str(block)}


def _block_text(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        mime = block.get("mimeType") or block.get("mime_type") or kind
        return f"[{mime}, {_size(block.get('data', ''))}: not readable as text]"
    if kind == "resource":
        resource = block.get("resource") or {}
        if "text" in resource:
            return f"[resource {resource.get('uri', '')}]\n{resource['text']}"
        mime = resource.get("mimeType") or resource.get("mime_type") or "binary"
        return f"[resource {resource.get('uri', '')}: {mime}, {_size(resource.get('blob', ''))}]"
    if kind == "resource_link":
        return f"[link: {block.get('name', '')} {block.get('uri', '')}]"
    return f"[{kind} content: not shown]"


def _size(data: str) -> str:
    try:
        n = len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        n = len(data)
    return f"{n / 1024:.0f} kB" if n >= 1024 else f"{n} bytes"


def cut_to(text: str, max_chars: int) -> tuple[str, int]:
    """`text` cut to about `max_chars` characters at a line break where one is near, with a
    note the model reads; returns (text, its length before: 0 when it was not cut)."""
    if len(text) <= max_chars:
        return text, 0
    keep = max(0, max_chars - 120)
    head = text[:keep]
    newline = head.rfind("\n")
    if newline > keep * 3 // 4:
        head = head[:newline]
    note = (
        f"\n[... result cut: {len(text):,} characters, the first {len(head):,} shown. "
        "Ask for a smaller part if you need the rest.]"
    )
    return head + note, len(text)


def outcome(
    content: list[Any],
    structured: dict[str, Any] | None,
    is_error: bool,
    max_chars: int = MAX_RESULT_CHARS,
) -> ToolOutcome:
    """A finished call's outcome: its text for the model, cut to `max_chars`."""
    text, full = cut_to(result_text(content, structured), max_chars)
    return ToolOutcome(
        text, is_error=is_error, full_chars=full, kind="error" if is_error else "result"
    )
