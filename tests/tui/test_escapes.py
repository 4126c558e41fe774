"""No text the app draws sends a control sequence to the terminal.

A stored chat whose title and messages hold escape sequences (the terminal's title, its
clipboard, a cleared screen, C1 CSI) is opened with the chats panel shown; what the screen would
write to the terminal (the compositor's full update, as the driver gets it) carries none of them,
and the messages show them as visible stand-ins.
"""

from __future__ import annotations

import re

import pytest
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from localfab.chat.history import History
from localfab.tui import textual_fixes
from localfab.tui.app import LocalfabApp
from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.sessions import SessionItem
from tests.tui_support import build_app, loaded, wait_for

pytestmark = pytest.mark.anyio

TITLE = "\x1b]0;PWNED-TITLE\x07 plans"
USER = "copy this \x1b]52;c;cHduZWQ=\x07 please \x9b2J and \x1b[2J"
ASSISTANT = "sure \x1b]2;OWNED\x1b\\ done\x1b[31m red\x00\x7f"
HOSTILE = ["\x1b]0;", "\x1b]2;", "\x1b]52;", "\x1b[2J", "\x9b", "\x07", "\x00", "\x1b[31m red"]


def written(app: LocalfabApp) -> str:
    """What the screen writes to the terminal for a full redraw."""
    update = app.screen._compositor.render_full_update()
    return update.render_segments(app.console)


def test_strips_draw_no_control_character_of_their_text() -> None:
    assert not textual_fixes.fix_controls_in_strips()  # applied when the app was imported
    strip = Strip([Segment("a\x1b]0;T\x07b", Style(bold=True)), Segment("\x9b2J\tc", None)])
    out = strip.render(Console())
    assert out == "\x1b[1ma]0;Tb\x1b[0m2J\tc"
    assert strip.cell_length == 9  # unchanged: controls have no width


async def test_a_hostile_chat_reaches_the_terminal_without_its_escapes(history: History) -> None:
    sid = history.create_session(model="fake-model")
    history.add_message(sid, "user", USER)
    history.add_message(sid, "assistant", ASSISTANT)
    history.rename_session(sid, TITLE)
    app, _ = build_app(history, session_id=sid)
    async with app.run_test(size=(120, 30)) as pilot:
        chat = await loaded(pilot, app)
        await wait_for(pilot, lambda: len(chat.query(MessageView)) == 2)
        # At 120 columns the chats panel shows, with the hostile title.
        await wait_for(pilot, lambda: bool(app.screen.query(SessionItem)))
        await wait_for(pilot, lambda: "plans" in written(app) and "OWNED" in written(app))
        out = written(app)
        assert "␛]0;PWNED-TITLE␇ plans" in out  # the title is drawn, its controls shown
        assert "OWNED" in out
        for seq in HOSTILE:  # ... without a sequence a terminal acts on
            assert seq not in out, repr(seq)
        # Only the app's own sequences remain: colours, cursor moves and links.
        rest = re.sub(r"\x1b\[[0-9;:?]*[mHlhJK]|\x1b\]8;[^\x1b]*\x1b\\", "", out)
        assert "\x1b" not in rest
        # The messages show what was there, as visible stand-ins.
        user, assistant = chat.query(MessageView)
        assert "␛]52;c;cHduZWQ=␇" in user.markdown.source
        assert "␛[2J" in user.markdown.source  # C1 CSI shows as ESC [
        assert "␛]2;OWNED␛\\" in assistant.markdown.source
        assert user.text == USER  # the stored text is kept as it was
