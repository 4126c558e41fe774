"""Text that is safe to put on a terminal: no control character reaches it raw.

Chat text, titles, file names and model output can carry terminal escape sequences (an
imported export, a document the model echoes, a hostile GGUF's metadata). Written raw, `ESC ]
0;...` sets the terminal's title, `ESC ] 52;...` writes the clipboard and `ESC [ 2J` clears the
screen; C1 controls (U+0080-U+009F, CSI is U+009B) do the same on terminals that read them.
Rich drops only a few of these (BEL, BS, VT, FF, CR). Here every C0 control but tab and
newline, DEL and every C1 control becomes a visible stand-in, so the text still says what was
there; `strip_controls` removes them instead, where a stand-in would change a line's width.
"""

from __future__ import annotations

import re

# C0 controls show as their Unicode control pictures (ESC as "␛"), DEL as "␡"; a C1 control as
# "␛" and its 7-bit equivalent (CSI U+009B as "␛["), which is what a terminal reads it as.
_VISIBLE: dict[int, str] = {c: chr(0x2400 + c) for c in range(0x20) if c not in (0x09, 0x0A)}
_VISIBLE[0x0D] = ""  # a CR (alone, or in a CRLF line ending) is dropped, as Rich drops it
_VISIBLE[0x7F] = "\u2421"
_VISIBLE.update({c: "\u241b" + chr(c - 0x40) for c in range(0x80, 0xA0)})
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_STRIP: dict[int, None] = dict.fromkeys(_VISIBLE)


def has_controls(text: str) -> bool:
    """Whether `text` holds a character that `visible_controls` would replace."""
    return _CONTROLS.search(text) is not None


def visible_controls(text: str) -> str:
    """`text` with every control character but tab and newline shown as a visible stand-in
    (a CR is dropped: CRLF line endings become newlines, and no line is overwritten)."""
    if not has_controls(text):  # the common case: one scan, no copy
        return text
    return text.translate(_VISIBLE)


def strip_controls(text: str) -> str:
    """`text` without any control character but tab and newline."""
    if not has_controls(text):
        return text
    return text.translate(_STRIP)


def json_controls(text: str) -> str:
    """JSON text (from `json.dumps(..., ensure_ascii=False)`) with C1 controls and DEL written as
    `\\u` escapes: the same JSON value, but nothing a terminal acts on (json already escapes
    C0 controls)."""
    return re.sub("[\x7f-\x9f]", lambda m: f"\\u{ord(m.group()):04x}", text)
