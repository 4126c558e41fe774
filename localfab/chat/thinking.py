"""What a chat template does with thinking: whether and how replies to it think, and the
capabilities `/props` reports (`chat_template_caps`, as llama-server's, with the thinking ones).
"""

from __future__ import annotations

import functools

from localfab.chat.templates import ChatTemplate
from localfab.engine.reasoning import PROBE_CONTENT, PROBE_REASONING, Thinking, thinking_of
from localfab.errors import UsageError


def template_thinking(template: ChatTemplate, generation_prompt: str) -> Thinking | None:
    """How replies to `generation_prompt` (its end will do) think with `template` (None: not a
    thinking template, or a built-in one); the whitespace it writes after its tags is read
    from a rendered probe reply."""
    if template.builtin:
        return None
    return thinking_of(template.source, generation_prompt, _probe(template))


@functools.lru_cache(maxsize=16)
def _probe(template: ChatTemplate) -> str:
    """The template's rendering of a reply with a reasoning and a content ("" on failure)."""
    reply = {"role": "assistant", "content": PROBE_CONTENT, "reasoning_content": PROBE_REASONING}
    try:
        return template.render(
            [{"role": "user", "content": "U"}, reply], add_generation_prompt=False
        )
    except UsageError:
        return ""


PRESERVED = "PR3S3RV3D"


@functools.lru_cache(maxsize=16)
def template_caps(template: ChatTemplate) -> dict[str, bool]:
    """The thinking capabilities of a template: it thinks (`supports_thinking`), takes
    `enable_thinking` and `reasoning_effort`, and keeps an earlier turn's reasoning in the
    prompt (`supports_preserve_reasoning`, found as llama-server finds it: by rendering one)."""
    user = {"role": "user", "content": "U"}
    turn = {"role": "assistant", "content": "A", "reasoning_content": PRESERVED}
    try:
        rendered = template.render([user, turn, user], add_generation_prompt=True)
    except UsageError:
        rendered = ""
    thinking = None if template.builtin else thinking_of(template.source, rendered)
    return {
        "supports_thinking": thinking is not None,
        "supports_enable_thinking": thinking is not None and thinking.toggle,
        "supports_reasoning_effort": "reasoning_effort" in template.source,
        "supports_preserve_reasoning": PRESERVED in rendered,
    }
