"""ChatSession on the real test model: shift at turn boundaries, continuation, persistence."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from localfab.chat.history import SCHEMA_VERSION, History
from localfab.chat.prompt import PromptBuilder
from localfab.chat.session import ChatSession, Continued, Reply, Shifted
from localfab.engine import Engine, EngineSettings, SamplingParams, TokenEvent
from localfab.engine.types import GenerationOptions
from localfab.errors import ContextOverflow

GREEDY = SamplingParams.greedy()
SYSTEM = "You are a terse assistant for a lighthouse keeper. Answer in one short sentence."


@pytest.fixture(scope="module")
def small_engine(model_path: Path):
    eng = Engine(model_path, EngineSettings(n_ctx=1024, n_batch=512))
    yield eng
    eng.close()


def run_turn(session: ChatSession, text: str, **kw) -> tuple[Reply, list[Shifted], list[Continued]]:
    shifts, conts, reply = [], [], None
    for ev in session.send(text, GenerationOptions(sampling=GREEDY, **kw)):
        if isinstance(ev, Shifted):
            shifts.append(ev)
        elif isinstance(ev, Continued):
            conts.append(ev)
        elif isinstance(ev, Reply):
            reply = ev
        else:
            assert isinstance(ev, TokenEvent)
    assert reply is not None
    return reply, shifts, conts


def test_sixty_turns_in_a_1024_window(small_engine, tmp_path):
    small_engine.clear_cache()
    prompts = PromptBuilder(small_engine)
    history = History(tmp_path / "h.sqlite3")
    session = ChatSession(small_engine, prompts, system=SYSTEM, max_continues=0, history=history)
    n_shifts = 0
    for turn in range(60):
        reply, shifts, _ = run_turn(
            session, f"Turn {turn}: how is the weather at the lighthouse today?", max_tokens=24
        )
        n_shifts += len(shifts)
        for s in shifts:
            assert s.turns >= 1 and s.tokens > 0 and not s.reprocessed
        window = session.window()
        assert window[0] == {"role": "system", "content": SYSTEM}
        assert window[1]["role"] == "user"
        cached = small_engine.cached_tokens
        assert cached == session.expected_cache
        # The system prompt opens the cache: the tokens up to its end are the window's first.
        text = prompts.text(window)
        head = prompts.encode(text[: text.index(SYSTEM) + len(SYSTEM)])
        assert cached[: len(head) - 1] == head[:-1]
        assert len(cached) < small_engine.n_ctx
    assert n_shifts >= 5
    stored = history.messages(session.session_id)
    assert len(stored) == 120 and all(m.status in ("complete", "length") for m in stored)


def test_shift_keeps_the_model_behaviour(small_engine):
    """Greedy decoding after a KV shift agrees with a fresh evaluation of the same tokens.

    The kept cells were computed while the dropped turns were still visible, so they carry traces
    of them and exact equality is not expected (every KV shift, llama-server's included, has this
    property). What must hold is that, fed the same tokens, a fresh evaluation mostly picks the
    same next token: the agreement is measured position by position (teacher forcing), and
    compared with how well the full, unshifted context agrees.
    """
    prompts = PromptBuilder(small_engine)
    turns = []
    for i in range(8):
        turns += [
            {"role": "user", "content": f"Question {i}: name a colour of the sea at dusk."},
            {"role": "assistant", "content": f"Answer {i}: a deep violet blue, turning grey."},
        ]
    sys_msg = [{"role": "system", "content": SYSTEM}]
    question = [{"role": "user", "content": "Describe the lighthouse beam in the fog."}]
    full = prompts.tokens(sys_msg + turns + question)
    kept = prompts.tokens(sys_msg + turns[8:] + question)
    n = 48
    small_engine.clear_cache()
    small_engine.evaluate(full)
    a, b = small_engine.shift_to(kept)
    assert b > a  # cells were moved, not re-processed
    no_eos = SamplingParams(temperature=0, ignore_eos=True)
    shifted = small_engine.generate(kept, max_tokens=n, sampling=no_eos)
    assert shifted.timings.prompt_n == 1  # only the last prompt token was evaluated again

    def agreement(prefix: list[int]) -> int:
        """How many of the shifted run's choices a fresh evaluation of prefix + run repeats."""
        small_engine.clear_cache()
        same = 0
        for i in range(n):
            small_engine.evaluate(prefix + list(shifted.tokens[:i]))
            same += small_engine.top_tokens(1)[0][0] == shifted.tokens[i]
        return same

    fresh_kept = agreement(kept)
    full_context = agreement(full)
    print(
        f"shift agreement: {fresh_kept}/{n} next-token choices identical to a fresh evaluation "
        f"of the kept window (the full, unshifted context: {full_context}/{n})"
    )
    # The shifted cache sits between the full context (whose traces its cells keep) and a fresh
    # evaluation of the kept window: it must agree with the fresh evaluation at least about as
    # well as the full context does, and on most choices. Measured here: 39/48 and 38/48.
    assert fresh_kept >= full_context - 3
    assert fresh_kept / n >= 0.7


def test_continuation_joins_to_one_long_generation(small_engine):
    prompts = PromptBuilder(small_engine)
    small_engine.clear_cache()
    long = ChatSession(small_engine, prompts, system=SYSTEM, max_continues=0)
    ref, _, _ = run_turn(long, "Tell me about the history of lighthouses.", max_tokens=48)
    small_engine.clear_cache()
    cut = ChatSession(small_engine, prompts, system=SYSTEM, max_continues=3)
    reply, _, conts = run_turn(cut, "Tell me about the history of lighthouses.", max_tokens=12)
    assert [c.count for c in conts] == [1, 2, 3]
    assert reply.continues == 3 and reply.completion_tokens == 48
    assert reply.text == ref.text


def test_message_too_long_for_the_window(small_engine):
    session = ChatSession(small_engine, PromptBuilder(small_engine), system=SYSTEM)
    with pytest.raises(ContextOverflow) as info:
        list(session.send("lighthouse " * 1500, GenerationOptions(max_tokens=8)))
    assert info.value.n_ctx == small_engine.n_ctx and info.value.n_prompt_tokens > 1024
    assert session.messages == []


def test_shift_during_a_long_reply(small_engine):
    small_engine.clear_cache()
    session = ChatSession(
        small_engine, PromptBuilder(small_engine), system=SYSTEM, max_continues=0, reply_reserve=64
    )
    for i in range(8):
        run_turn(session, f"Turn {i}: " + "tell me about waves " * 10, max_tokens=60)
    before = session.window_start
    events = list(
        session.send(
            "Now write a very long story about the sea.",
            GenerationOptions(
                max_tokens=700, sampling=SamplingParams(temperature=0, ignore_eos=True)
            ),
        )
    )
    during = [e for e in events if isinstance(e, Shifted) and e.during_reply]
    reply = events[-1]
    assert isinstance(reply, Reply)
    assert during and session.window_start > before
    assert reply.completion_tokens == 700  # generation went on past the end of the window
    assert session.window()[0]["role"] == "system"


@pytest.mark.model
@pytest.mark.slow  # loads the model in a child process
def test_killed_process_leaves_message_and_partial_reply(model_path: Path, tmp_path: Path):
    import select

    db = tmp_path / "sessions.sqlite3"
    # The child says when part of the reply is in the database, then waits there, mid-reply,
    # to be killed: no guess at how long storing takes.
    script = textwrap.dedent(f"""
        import sys
        from localfab.chat.history import History
        from localfab.chat.prompt import PromptBuilder
        from localfab.chat.session import ChatSession
        from localfab.engine import Engine, EngineSettings, SamplingParams, TokenEvent
        from localfab.engine.types import GenerationOptions
        eng = Engine({str(model_path)!r}, EngineSettings(n_ctx=1024))
        history = History(__import__("pathlib").Path({str(db)!r}))
        s = ChatSession(eng, PromptBuilder(eng), history=history)
        sampling = SamplingParams(temperature=0.7, seed=1, ignore_eos=True)
        options = GenerationOptions(max_tokens=900, sampling=sampling)
        for ev in s.send("Write a long story about a lighthouse.", options):
            if isinstance(ev, TokenEvent):
                stored = history.messages(s.session_id)[-1]
                if stored.role == "assistant" and len(stored.content) > 10:
                    print("stored", flush=True)
                    sys.stdin.readline()
    """)
    with subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        ready: list[object] = []
        while not ready and time.monotonic() < deadline:
            left = max(deadline - time.monotonic(), 0.0)
            ready = select.select([proc.stdout], [], [], left)[0]
        assert ready, "no part of the reply was stored within 300 s"
        assert proc.stdout.readline().strip() == "stored"  # "" if the child ended first
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    history = History(db)
    (session,) = history.sessions()
    messages = history.messages(session.id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].content == "Write a long story about a lighthouse."
    assert len(messages[1].content) > 10 and messages[1].status == "interrupted"
    assert history.schema_version == SCHEMA_VERSION


def test_resume_rebuilds_the_window(small_engine, tmp_path):
    small_engine.clear_cache()
    prompts = PromptBuilder(small_engine)
    history = History(tmp_path / "h.sqlite3")
    session = ChatSession(small_engine, prompts, system=SYSTEM, history=history, max_continues=0)
    for i in range(3):
        run_turn(session, f"Question {i}?", max_tokens=8)
    small_engine.clear_cache()
    again = ChatSession.resume(history, session.session_id, small_engine, prompts, max_continues=0)
    assert again.messages == session.messages and again.system == SYSTEM
    assert (
        small_engine.cached_tokens
        == prompts.tokens(again.window())[: len(small_engine.cached_tokens)]
    )
    reply, _, _ = run_turn(again, "And one more?", max_tokens=8)
    assert reply.pieces[0].timings.cache_n > 20  # the rebuilt window was reused


def test_a_reply_split_unlike_the_tokenizer_is_reused_whole(small_engine):
    """A reply's tokens stay in the prompt as generated, so the next turn reuses all of them.

    The grammar forces the text "lighthouse lighthouse" while the bias bans the two tokens the
    tokenizer would use for it, so the model must spell it from smaller pieces: re-tokenizing
    the text would disagree with the cache from the reply's first token on.
    """
    small_engine.clear_cache()
    canonical = small_engine.tokenize("lighthouse lighthouse", add_special=False)
    forced = SamplingParams(
        temperature=0.0,
        grammar='root ::= "lighthouse lighthouse"',
        logit_bias=tuple((t, float("-inf")) for t in canonical),
    )
    prompts = PromptBuilder(small_engine)
    session = ChatSession(small_engine, prompts, system=SYSTEM, max_continues=0)
    reply = None
    for ev in session.send(
        "Say lighthouse twice.", GenerationOptions(max_tokens=24, sampling=forced)
    ):
        if isinstance(ev, Reply):
            reply = ev
    assert reply is not None and reply.text == "lighthouse lighthouse"
    generated = list(reply.pieces[-1].tokens)
    assert generated != canonical and len(generated) > len(canonical)
    in_cache = list(session.expected_cache)
    assert small_engine.cached_tokens == in_cache

    # Re-tokenized from text, the conversation would part from the cache where the reply starts.
    retokenized = prompts.tokens(session.window() + [{"role": "user", "content": "Again."}])
    reply_start = len(in_cache) - len(generated)
    assert retokenized[:reply_start] == in_cache[:reply_start]
    assert retokenized[reply_start : reply_start + len(generated)] != generated

    again, _, _ = run_turn(session, "Again.", max_tokens=4)
    assert again.timings.cache_n == len(in_cache)  # the whole reply came from the cache
    assert again.timings.prompt_n < 16


def test_another_process_opening_the_history_leaves_a_live_reply_alone(
    model_path: Path, tmp_path: Path
):
    """A reply streaming in one process stays `generating` when another opens the database."""
    db = tmp_path / "sessions.sqlite3"
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from localfab.chat.history import History
        from localfab.chat.prompt import PromptBuilder
        from localfab.chat.session import ChatSession
        from localfab.engine import Engine, EngineSettings, SamplingParams, TokenEvent
        from localfab.engine.types import GenerationOptions
        eng = Engine({str(model_path)!r}, EngineSettings(n_ctx=1024))
        s = ChatSession(eng, PromptBuilder(eng), history=History(Path({str(db)!r})))
        n = 0
        sampling = SamplingParams(temperature=0, ignore_eos=True)
        for ev in s.send("Write a story about a lighthouse.", GenerationOptions(40, sampling)):
            n += isinstance(ev, TokenEvent)
            if n == 5:
                print("streaming", flush=True)
                sys.stdin.readline()  # the reply waits, half-written, until told to go on
    """)
    with subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "streaming"
        other = History(db)
        (session,) = other.sessions()
        assert [m.status for m in other.messages(session.id)] == ["complete", "generating"]
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=120) == 0
        reply = other.messages(session.id)[-1]
        assert reply.status == "length" and len(reply.content) > 20
        other.close()


def test_continuing_a_reply_updates_its_stored_row(small_engine, tmp_path):
    """A reply continued later (Continue in the chat app, or after resuming) stays one message
    in the history, so a resumed session does not send the reply twice."""
    small_engine.clear_cache()
    prompts = PromptBuilder(small_engine)
    history = History(tmp_path / "h.sqlite3")
    session = ChatSession(small_engine, prompts, system=SYSTEM, history=history, max_continues=0)
    reply, _, _ = run_turn(session, "Describe the lighthouse.", max_tokens=6)
    assert reply.finish_reason == "length"
    final = None
    for ev in session.continue_reply(GenerationOptions(max_tokens=6, sampling=GREEDY)):
        if isinstance(ev, Reply):
            final = ev
    assert final is not None and final.text.startswith(reply.text)
    stored = history.messages(session.session_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].content == final.text
    again = ChatSession.resume(history, session.session_id, small_engine, prompts)
    for ev in again.continue_reply(GenerationOptions(max_tokens=4, sampling=GREEDY)):
        if isinstance(ev, Reply):
            final = ev
    stored = history.messages(session.session_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].content == final.text
