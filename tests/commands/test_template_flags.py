"""llama-server's template flags on run and serve: --chat-template (a built-in's name or a
template's text), --chat-template-file, and the template variables --reasoning-effort,
--reasoning-preserve and --reasoning set."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from localfab.chat.prompt import PromptBuilder
from localfab.commands.thinking import use_template_file
from localfab.errors import UsageError
from localfab.server import ServerSettings
from tests.fake_engine import FakeEngine

USER = [{"role": "user", "content": "Hi"}]


def loaded() -> SimpleNamespace:
    engine = FakeEngine()
    prompts = PromptBuilder(engine)
    return SimpleNamespace(engine=engine, prompts=prompts, notices=[])


def test_chat_template_takes_a_built_in_name_or_a_template(tmp_path: Path) -> None:
    model = loaded()
    use_template_file(model, None, "llama3")
    assert model.prompts.template.name == "llama3" and model.prompts.template.builtin
    assert "<|start_header_id|>user<|end_header_id|>" in model.prompts.text(USER)
    use_template_file(model, None, "{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert model.prompts.text(USER) == "[Hi]" and not model.prompts.template.builtin
    path = tmp_path / "t.jinja"
    path.write_text("<{{ messages[0].content }}>")
    use_template_file(model, path)
    assert model.prompts.text(USER) == "<Hi>"
    with pytest.raises(UsageError, match="not both"):
        use_template_file(model, path, "chatml")
    with pytest.raises(UsageError, match="cannot read the chat template file"):
        use_template_file(model, tmp_path / "missing.jinja")
    untouched = loaded()
    before = untouched.prompts
    use_template_file(untouched, None, None)
    assert untouched.prompts is before


def test_reasoning_flags_reach_the_template_variables() -> None:
    assert ServerSettings().template_variables() == {}
    settings = ServerSettings(
        reasoning="off",
        reasoning_effort="low",
        reasoning_preserve=True,
        chat_template_kwargs=(("x", 1),),
    )
    assert settings.template_variables() == {
        "x": 1,
        "reasoning_effort": "low",
        "preserve_reasoning": True,
        "enable_thinking": False,
    }
    # The request's own chat_template_kwargs come last.
    assert settings.template_variables({"enable_thinking": True})["enable_thinking"] is True
