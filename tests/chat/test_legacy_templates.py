"""llama.cpp's built-in chat formats by name, rendered by llama.cpp's own code."""

from __future__ import annotations

import pytest

from localfab.chat.legacy_templates import legacy_template
from localfab.errors import UsageError

COMMAND_R = (
    "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
)


def test_a_llama_cpp_name_renders_as_llama_server_renders_it():
    # The prompt llama.cpp's own server test expects for --chat-template command-r.
    template = legacy_template("command-r")
    assert template is not None and template.builtin
    msgs = [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": "Hi there"},
    ]
    assert template.render(msgs) == COMMAND_R
    assert not template.render(msgs, add_generation_prompt=False).endswith("<|CHATBOT_TOKEN|>")


def test_text_parts_are_joined_and_a_reply_continues_where_it_stops():
    template = legacy_template("mistral-v7")
    assert template is not None
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "Once upon"},
    ]
    whole = template.render(msgs[:1])
    assert "a\nb" in whole
    continued = template.render(msgs, continue_final=True)
    assert continued.endswith("Once upon") and continued.startswith(whole.rstrip()[:10])


def test_the_project_templates_come_first_and_unknown_names_are_none():
    assert legacy_template("chatml") is None  # the Jinja built-in serves it
    assert legacy_template("no-such-format") is None
    assert legacy_template("zephyr") is not None


def test_a_continuation_of_a_missing_reply_is_refused():
    template = legacy_template("zephyr")
    assert template is not None
    with pytest.raises(UsageError, match="assistant"):
        template.render([{"role": "user", "content": "x"}], continue_final=True)
