"""Chat templates: the model's own (from GGUF metadata) rendered in a sandbox, or a built-in one.

GGUF chat templates are Jinja programs written by whoever made the file, so they are untrusted
input: they run in Jinja's immutable sandbox, with only the helpers Hugging Face templates expect.
A model without a template (base models such as the test model) gets a built-in template chosen
by its architecture, and the caller is told so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localfab.errors import UsageError

ROLES = ("system", "user", "assistant", "tool")

_GEMMA = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<start_of_turn>model\n' }}
{%- endif -%}"""

_CHATML = """{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|im_start|>assistant\n' }}
{%- endif -%}"""

_LLAMA3 = """{{ bos_token }}
{%- for message in messages -%}
{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif -%}"""

_PHI3 = """{%- for message in messages -%}
{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|assistant|>\n' }}
{%- endif -%}"""

BUILTIN_TEMPLATES: dict[str, str] = {
    "gemma": _GEMMA,
    "chatml": _CHATML,
    "llama3": _LLAMA3,
    "phi3": _PHI3,
}

# Architecture (general.architecture) -> built-in template for models that carry none.
_BY_ARCH = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "llama": "llama3",
    "phi3": "phi3",
}

_CONTINUE_MARK = "\x00localfab-continue\x00"


def _raise(message: str) -> None:
    raise TemplateError(message)


def _make_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    return env


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and where it came from."""

    source: str
    name: str  # "gguf" or a built-in name
    bos_token: str = ""
    eos_token: str = ""

    @property
    def builtin(self) -> bool:
        return self.name != "gguf"

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
    ) -> str:
        """The conversation as the model's prompt text.

        With `continue_final`, the last message is an assistant reply to be continued: the text
        ends exactly where that reply's text ends (no end-of-turn marker), so generation picks up
        mid-reply instead of starting a new turn.
        """
        msgs = [dict(m) for m in messages]
        if continue_final:
            if not msgs or msgs[-1].get("role") != "assistant":
                raise UsageError("only an assistant message at the end can be continued")
            final = msgs[-1].get("content") or ""
            msgs[-1]["content"] = _CONTINUE_MARK
            text = self._render(msgs, add_generation_prompt=False)
            cut = text.rfind(_CONTINUE_MARK)
            if cut < 0:
                raise UsageError("the chat template dropped the reply to continue")
            return text[:cut] + final
        return self._render(msgs, add_generation_prompt=add_generation_prompt)

    def _render(self, msgs: list[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        env = _make_env()
        try:
            template = env.from_string(self.source)
            return template.render(
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as exc:
            raise UsageError(
                f"the chat template ({self.name}) failed: {exc}; "
                "check the messages, or send raw text without a template"
            ) from exc


def resolve_template(
    gguf_template: str | None,
    architecture: str,
    *,
    bos_token: str = "",
    eos_token: str = "",
) -> tuple[ChatTemplate, str | None]:
    """The template to use and a notice when it is not the model's own."""
    if gguf_template and gguf_template.strip():
        return ChatTemplate(gguf_template, "gguf", bos_token, eos_token), None
    name = _BY_ARCH.get(architecture, "chatml")
    notice = (
        f"the model has no chat template; using the built-in {name!r} template "
        f"for architecture {architecture or 'unknown'!r}"
    )
    return ChatTemplate(BUILTIN_TEMPLATES[name], name, bos_token, eos_token), notice


def validate_messages(messages: object) -> list[dict[str, str]]:
    """Check a list of {role, content} messages; raise UsageError saying what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise UsageError("'messages' must be a non-empty array")
    out: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise UsageError(f"messages[{i}] must be an object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            raise UsageError(f"messages[{i}].role must be one of {', '.join(ROLES)}, not {role!r}")
        content = message.get("content")
        if content is None:
            content = ""
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise UsageError(f"messages[{i}].content: only text parts are supported")
                texts.append(str(part.get("text", "")))
            content = "".join(texts)
        if not isinstance(content, str):
            raise UsageError(f"messages[{i}].content must be a string")
        out.append({"role": role, "content": content})
    return out
