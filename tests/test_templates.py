"""Chat templates: sandboxed GGUF templates, built-ins by architecture, continuation rendering."""

from __future__ import annotations

import pytest

from localfab.errors import UsageError
from localfab.templates import ChatTemplate, resolve_template, validate_messages

CHATML_GGUF = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How"},
]


def test_gguf_template_is_used_when_present():
    template, notice = resolve_template(CHATML_GGUF, "qwen2")
    assert notice is None and template.name == "gguf"
    text = template.render(MSGS[:2])
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_builtin_template_by_architecture_with_a_notice():
    template, notice = resolve_template(None, "gemma3", bos_token="<bos>")
    assert template.name == "gemma" and notice and "gemma3" in notice
    text = template.render(MSGS[:2])
    # Gemma has no system role: the system prompt opens the first user turn.
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert resolve_template("", "unknown-arch")[0].name == "chatml"


def test_continue_final_ends_exactly_at_the_reply_text():
    for source, arch in ((CHATML_GGUF, "qwen2"), (None, "gemma3"), (None, "llama")):
        template, _ = resolve_template(source, arch)
        text = template.render(MSGS, continue_final=True)
        assert text.endswith("Hello! How")
        assert "<|im_end|>" not in text[-12:] and "<end_of_turn>" not in text[-20:]


def test_sandbox_blocks_python_internals():
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}", "gguf")
    with pytest.raises(UsageError, match="chat template"):
        evil.render(MSGS[:2])
    mutate = ChatTemplate("{{ messages.append(1) }}", "gguf")
    with pytest.raises(UsageError):
        mutate.render(MSGS[:2])


def test_raise_exception_in_a_template_is_a_clear_error():
    strict = ChatTemplate("{{ raise_exception('roles must alternate') }}", "gguf")
    with pytest.raises(UsageError, match="roles must alternate"):
        strict.render(MSGS[:2])


@pytest.mark.parametrize(
    "bad, needle",
    [
        ([], "non-empty"),
        ("hi", "non-empty"),
        ([{"role": "wizard", "content": "x"}], "role"),
        ([{"role": "user", "content": 5}], "string"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "text parts"),
    ],
)
def test_validate_messages_rejects_bad_input(bad, needle):
    with pytest.raises(UsageError, match=needle):
        validate_messages(bad)


def test_validate_messages_joins_text_parts():
    out = validate_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert out == [{"role": "user", "content": "ab"}]
