"""Control characters never reach a terminal raw: the rule, `localfab run` on a terminal (a pipe
gets the bytes), and `localfab stats` on a damaged ledger."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest

from localfab.chat.events import Reply
from localfab.commands.run import _stream
from localfab.engine.types import Timings, TokenEvent
from localfab.textsafe import has_controls, json_controls, strip_controls, visible_controls

HOSTILE = "a\x1b]0;T\x07b\x9b2J\x1b[2Jc\x00\x7f\r\n\td"


def test_every_control_but_tab_and_newline_is_made_visible() -> None:
    shown = visible_controls(HOSTILE)
    assert shown == "a␛]0;T␇b␛[2J␛[2Jc␀␡\n\td"
    assert not has_controls(shown)
    for c in range(0xA0):  # every C0, DEL and C1 control
        ch = chr(c)
        out = visible_controls(ch)
        if ch in "\t\n":
            assert out == ch
        else:
            assert not has_controls(out) and (out or ch == "\r"), hex(c)
    assert visible_controls("plain text, ünïcode ✓") == "plain text, ünïcode ✓"


def test_strip_keeps_only_printable_text_tab_and_newline() -> None:
    assert strip_controls(HOSTILE) == "a]0;Tb2J[2Jc\n\td"


def test_json_keeps_its_value_without_raw_c1_controls() -> None:
    value = {"text": "x\x9b2J\x7fy"}
    line = json_controls(json.dumps(value, ensure_ascii=False))
    assert not has_controls(line)
    assert json.loads(line) == value


class Tty(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_run_shows_controls_on_a_terminal_and_pipes_bytes_exactly(
    tty: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = Tty(tty)
    monkeypatch.setattr("sys.stdout", out)
    pieces = ["Hi \x1b]52;c;cHduZWQ=", "\x07 there", " \x9b2J"]
    reply = Reply("".join(pieces), "stop", "eos", 0, (), Timings())
    events = [TokenEvent(i, p) for i, p in enumerate(pieces)] + [reply]
    _stream(iter(events), as_json=False, verbose=False)
    if tty:
        assert out.getvalue() == "Hi ␛]52;c;cHduZWQ=␇ there ␛[2J"
    else:
        assert out.getvalue() == "".join(pieces)


def test_stats_shows_a_damaged_ledgers_controls(lf_env: dict[str, str]) -> None:
    """A `day` and a model name with ESC in a hand-edited ledger are shown, not sent raw."""
    from tests.ledger.test_stats import lf, seeded

    ledger = seeded(Path(lf_env["LOCALFAB_HOME"]))
    db = sqlite3.connect(ledger.path)
    with db:
        db.execute("UPDATE generations SET day = ? WHERE model = 'qwen'", ("\x1b]0;DAY\x07",))
        db.execute("UPDATE generations SET model = ? WHERE model = 'qwen'", ("q\x9b2Jwen",))
    db.close()
    proc = lf(["stats"], lf_env)
    assert proc.returncode == 0, proc.stderr
    assert "␛]0;DAY␇" in proc.stdout and "q␛[2Jwen" in proc.stdout
    assert not has_controls(proc.stdout.replace("\n", ""))


def test_stats_leaves_out_rows_whose_numbers_are_text(lf_env: dict[str, str]) -> None:
    """A hand-edited ledger with text in numeric columns: the report, not a traceback."""
    from tests.ledger.test_stats import lf, seeded

    ledger = seeded(Path(lf_env["LOCALFAB_HOME"]))
    db = sqlite3.connect(ledger.path)
    with db:
        db.execute("UPDATE generations SET generated_tokens = 'lots' WHERE model = 'qwen'")
        db.execute("UPDATE generations SET decode_tok_s = 'fast' WHERE label = 'base-b'")
        db.execute("UPDATE generations SET peak_memory = '[[[' WHERE label = 'base-a'")
    db.close()
    for args in (["stats"], ["stats", "--json"]):
        proc = lf(args, lf_env)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "1 row(s) left out" in lf(["stats"], lf_env).stdout
    data = json.loads(lf(["stats", "--json"], lf_env).stdout)
    assert data["replies"] == 5 and data["damaged"] == 1
    models = {s["key"] for s in data["models"]}
    assert "gemma" in models and "qwen" not in models
