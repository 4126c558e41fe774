"""Small pure pieces of the terminal app."""

from __future__ import annotations

from localfab.tui.backend import ReplyFinished, StoredTurn
from localfab.tui.screens.chat import merge_continued, reply_footer
from localfab.tui.widgets.messages import shift_text
from localfab.tui.widgets.status import compact, gauge
from localfab.units import format_ms as duration


def test_a_continued_reply_stored_twice_is_shown_once():
    turns = [
        StoredTurn("user", "q"),
        StoredTurn("assistant", "Hello wor", "length"),
        StoredTurn("assistant", "Hello world.", "complete"),
        StoredTurn("user", "again"),
        StoredTurn("assistant", "Different"),
        StoredTurn("assistant", "Not a continuation"),
    ]
    shown = merge_continued(turns)
    assert [(t.role, t.content) for t in shown] == [
        ("user", "q"),
        ("assistant", "Hello world."),
        ("user", "again"),
        ("assistant", "Different"),
        ("assistant", "Not a continuation"),
    ]


def test_the_reply_footer_says_how_it_ended():
    done = ReplyFinished("x", "length", 64, 1234.0, 31.25, continues=0)
    text, kind = reply_footer(done)
    assert kind == "cut" and "cut at the token limit" in text and "ctrl+r" in text
    assert "64 tokens · 31.2 tok/s · TTFT 1.2 s" in text
    text, kind = reply_footer(ReplyFinished("x", "cancelled", 3, 80.0, 0.0))
    assert kind == "stopped" and "stopped" in text and "TTFT 80 ms" in text
    text, kind = reply_footer(ReplyFinished("x", "stop", 10, 80.0, 9.0, continues=2))
    assert kind == "" and "continued 2×" in text


def test_status_bar_figures():
    assert gauge(0, 4096) == "▱" * 10
    assert gauge(1, 4096) == "▰" + "▱" * 9  # any use shows
    assert gauge(2048, 4096) == "▰" * 5 + "▱" * 5
    assert gauge(9999, 4096) == "▰" * 10
    assert gauge(5, 0) == "▱" * 10
    assert [compact(n) for n in (999, 1234, 16384)] == ["999", "1.2k", "16k"]
    assert [duration(ms) for ms in (420.4, 5853.0)] == ["420 ms", "5.9 s"]
    assert shift_text(1, 40) == "1 turn (40 tokens) left the window; the system prompt stayed"
    assert shift_text(3, 400).startswith("3 turns (400 tokens)")
