"""A chat with a thinking template on the real test model: the thought is kept apart from the
answer in the session, the history, a resumed chat and an export, goes on through a
continuation, and the budget closes it.

The test model does not think on its own; DeepSeek-R1-Distill's real template opens the block
at the end of its generation prompt, so every reply starts inside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localfab.chat.history import History
from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatSession, Continued, Reply
from localfab.chat.transfer import export_json, export_markdown, import_json
from localfab.engine import Engine, EngineSettings, SamplingParams, TokenEvent
from localfab.engine.types import GenerationOptions

R1 = (
    Path(__file__).parents[1]
    / "engine"
    / "templates"
    / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
)
FORCED = SamplingParams(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Any:
    eng = Engine(model_path, EngineSettings(n_ctx=1024, n_batch=512))
    yield eng
    eng.close()


def session_for(engine: Any, history: History | None = None, **kw: Any) -> ChatSession:
    prompts = PromptBuilder(engine, source=R1.read_text())
    return ChatSession(engine, prompts, history=history, **kw)


def turn(session: ChatSession, text: str, **kw: Any) -> tuple[Reply, str, str, int]:
    """The reply, the thought and the answer as the events carried them, and continuations."""
    got = {"reasoning": "", "content": ""}
    reply, conts = None, 0
    for ev in session.send(text, GenerationOptions(sampling=FORCED, **kw)):
        if isinstance(ev, TokenEvent):
            assert ev.parts is not None
            for kind, piece in ev.parts:
                got[kind] += piece
        elif isinstance(ev, Continued):
            conts += 1
        elif isinstance(ev, Reply):
            reply = ev
    assert reply is not None
    return reply, got["reasoning"], got["content"], conts


def test_the_thought_is_kept_apart_stored_and_sent_back_as_the_template_wants(
    engine: Any, tmp_path: Path
) -> None:
    history = History(tmp_path / "h.sqlite3")
    session = session_for(engine, history, max_continues=0)
    reply, thought, answer, _ = turn(
        session, "Why is the sky blue?", max_tokens=40, reasoning_budget=16
    )
    assert reply.reasoning == thought and reply.text == answer
    # (The test model copies its prompt, tags and all: what it writes after the first
    # closing tag is answer, whatever it says.)
    assert thought and answer and "</think>" not in thought
    assert 0 < reply.reasoning_tokens <= 16 + 3
    last = session.messages[-1]
    assert last == {"role": "assistant", "content": answer, "reasoning_content": thought}
    stored = history.messages(session.session_id)[-1]
    assert (stored.content, stored.reasoning) == (answer, thought)
    # The next turn's prompt: R1's template shows earlier answers, not earlier thoughts.
    reply2, *_ = turn(session, "And at night?", max_tokens=8, reasoning_budget=0)
    window = session.window()[:-1]
    assert window[1]["reasoning_content"] == thought  # sent to the template, which drops it
    bare = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in window]
    assert session.prompts.text(window) == session.prompts.text(bare)
    # A resumed chat has the thought back where it was, and an export keeps it.
    again = ChatSession.resume(history, session.session_id, engine, session.prompts)
    assert again.messages[1]["reasoning_content"] == thought
    data = json.loads(export_json(history, session.session_id))
    assert data["messages"][1]["reasoning"] == thought and "reasoning" not in data["messages"][0]
    copy = import_json(history, export_json(history, session.session_id))
    assert [m.reasoning for m in history.messages(copy)] == [
        m.reasoning for m in history.messages(session.session_id)
    ]
    assert "<details><summary>Thought</summary>" in export_markdown(history, session.session_id)
    history.close()


def test_a_reply_cut_while_thinking_goes_on_thinking(engine: Any, tmp_path: Path) -> None:
    # Continued at the token limit, piece after piece: the thought grows, no answer yet.
    session = session_for(engine, max_continues=2)
    reply, thought, answer, conts = turn(session, "Count the stars.", max_tokens=10)
    assert conts == 2 and len(reply.pieces) == 3
    assert reply.reasoning == thought and answer == "" and reply.text == ""
    assert all(p.in_reasoning for p in reply.pieces)
    assert reply.reasoning_tokens == 30
    # Cut, then continued by hand (the app's "continue"): the same thought goes on.
    history = History(tmp_path / "h.sqlite3")
    session = session_for(engine, history, max_continues=0)
    first, thought, _, _ = turn(session, "Count the stars.", max_tokens=10)
    more = [ev for ev in session.continue_reply(GenerationOptions(max_tokens=10, sampling=FORCED))]
    done = more[-1]
    assert isinstance(done, Reply)
    assert done.reasoning.startswith(thought) and len(done.reasoning) > len(thought)
    assert done.text == "" and history.messages(session.session_id)[-1].reasoning == done.reasoning
    history.close()
