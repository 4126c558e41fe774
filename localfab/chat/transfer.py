"""Chat sessions out of and into the history: Markdown to read, JSON to import again.

Markdown holds the session's current path (one version of each message; a message with other
versions says which one it is). JSON holds every version: each message names its parent by its
place in the list, and the session names the message its current path ends at. Exports of
version 1 (before versions existed: one linear list) still import, as one path. A message's
images go with it, their bytes in base64 (Markdown names them).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import time
from typing import TYPE_CHECKING, Any

from localfab.chat.history_images import Attachment, refs_from
from localfab.chat.images import store_images
from localfab.chat.toolturns import check_stored, stored_calls, stored_tools
from localfab.errors import UsageError

if TYPE_CHECKING:
    from localfab.chat.history import History, StoredMessage, StoredSession

EXPORT_FORMAT = "localfab-chat"
EXPORT_VERSION = 2
READS_VERSIONS = (1, 2)
IMPORT_ROLES = ("system", "user", "assistant", "tool")
# The statuses a stored message can have; `generating` imports as `interrupted`.
IMPORT_STATUSES = ("complete", "length", "interrupted")
HEADINGS = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool result"}
# Imported numbers are bounded: a time between 1970 and the year 3000 (else the import's own
# time), and at most this many continuations.
LATEST_TIME = 32_503_680_000.0
MOST_CONTINUES = 10_000
MOST_IMAGES = 64  # images one imported message may carry


def _stored(history: History, session_id: int) -> StoredSession:
    session = history.session(session_id)
    if session is None:
        raise UsageError(f"there is no chat session {session_id}")
    return session


def _when(timestamp: float) -> str:
    """A stored time as a date, or "unknown" for one no calendar holds (an old import's 1e308)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))
    except (OverflowError, OSError, ValueError):
        return "unknown"


def _heading(m: StoredMessage) -> str:
    heading = HEADINGS.get(m.role, m.role.title())
    if m.status in ("length", "interrupted"):
        heading += f" ({'cut at the token limit' if m.status == 'length' else 'interrupted'})"
    if m.role == "tool":
        data = stored_tools(m.tools)
        heading += f" ({data.get('name', '')}, {data.get('kind', 'result')})"
    if m.versions > 1:
        heading += f" (version {m.version} of {m.versions})"
    return heading


def _calls_markdown(m: StoredMessage) -> list[str]:
    """An assistant message's tool calls, each a fenced JSON block under its name."""
    lines: list[str] = []
    for call in stored_calls(m.tools):
        lines += ["", f"Tool call `{call.name}`:", "", "```json"]
        arguments = call.arguments if isinstance(call.arguments, dict) else {"": call.arguments}
        lines += [json.dumps(arguments, ensure_ascii=False, indent=2), "```"]
    return lines


def export_markdown(history: History, session_id: int) -> str:
    """A session as Markdown: its title, model and system prompt, then its current path."""
    session = _stored(history, session_id)
    lines = [f"# {session.title or 'Chat'}", "", f"- Model: `{session.model}`"]
    lines.append(f"- Started: {_when(session.created)}")
    if session.system:
        lines += ["", "## System", "", session.system]
    for m in history.messages(session_id):
        lines += ["", f"## {_heading(m)}", ""]
        if m.reasoning:  # a thinking model's thought, folded as Markdown viewers fold it
            lines += ["<details><summary>Thought</summary>", "", m.reasoning, "", "</details>", ""]
        lines += [f"[image: {ref.label()}]" for ref in refs_from(m.images)]
        lines.append(m.content)
        lines += _calls_markdown(m)
    return "\n".join(lines) + "\n"


def export_json(history: History, session_id: int) -> str:
    """A session as JSON, every version of every message, that `import_json` reads back."""
    session = _stored(history, session_id)
    with history.read() as db:
        rows = db.execute(
            "SELECT id, parent_id, role, content, status, continues, created, updated, "
            "reasoning, tools, images FROM messages WHERE session_id=? ORDER BY seq",
            (session_id,),
        ).fetchall()
        leaf = db.execute("SELECT leaf_id FROM sessions WHERE id=?", (session_id,)).fetchone()[0]
    place = {row[0]: i for i, row in enumerate(rows)}
    fields = ("role", "content", "status", "continues", "created", "updated")
    messages = []
    for row in rows:
        message: dict[str, Any] = {"parent": place.get(row[1])}
        message.update(zip(fields, row[2:-3], strict=True))
        if row[-3]:
            message["reasoning"] = row[-3]
        if row[-2]:
            message["tools"] = stored_tools(row[-2])
        if row[-1]:
            message["images"] = _export_images(history, row[-1])
        messages.append(message)
    data = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "session": {
            "title": session.title,
            "model": session.model,
            "system": session.system,
            "created": session.created,
            "updated": session.updated,
            "current": place.get(leaf),
        },
        "messages": messages,
    }
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def _export_images(history: History, column: str) -> list[dict[str, Any]]:
    """A message's images with their bytes (base64), those whose files are still there."""
    out = []
    for ref in refs_from(column):
        data = history.images.get(ref)
        if data is not None:
            out.append({"name": ref.name, "data": base64.b64encode(data).decode("ascii")})
    return out


def _import_images(history: History, m: dict[str, Any], i: int) -> str:
    """An imported message's images, put in the history's store ("" for none)."""
    given = m.get("images") or []
    if not isinstance(given, list):
        raise UsageError(f"message {i + 1} of the chat export has images that are not a list")
    if len(given) > MOST_IMAGES:
        raise UsageError(
            f"message {i + 1} of the chat export has {len(given)} images, more than {MOST_IMAGES}"
        )
    found = []
    for image in given:
        try:
            data = base64.b64decode(image["data"], validate=True)
            name = str(image.get("name") or "image")
        except (TypeError, KeyError, ValueError, binascii.Error) as exc:
            raise UsageError(f"message {i + 1} of the chat export has a bad image") from exc
        found.append(Attachment(data, name))
    return store_images(history, found)


def _header(text: str) -> tuple[int, dict[str, Any], list[Any]]:
    """The export's version, session object and messages list, checked."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"not a localfab chat export: invalid JSON ({exc})") from exc
    except RecursionError as exc:
        raise UsageError("not a localfab chat export: its JSON is nested too deeply") from exc
    except ValueError as exc:  # a number of thousands of digits, and the like
        raise UsageError(f"not a localfab chat export: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise UsageError("not a localfab chat export: export a chat from localfab as JSON")
    version = data.get("version")
    if version not in READS_VERSIONS:
        raise UsageError(
            f"this chat export is version {version!r}; this localfab reads versions "
            f"{', '.join(map(str, READS_VERSIONS))}: update localfab"
        )
    session, messages = data.get("session"), data.get("messages")
    if not isinstance(session, dict) or not isinstance(messages, list):
        raise UsageError("a chat export needs a 'session' object and a 'messages' list")
    return int(version), session, messages


def _time(value: object, default: float) -> float:
    """A time from the export, if it is one a calendar holds (NaN, infinities, 1e308 and times
    before 1970 are not): else `default`."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            return default
        if math.isfinite(number) and 0 <= number <= LATEST_TIME:
            return number
    return default


def _text(value: str, where: str) -> str:
    """`value`, which must be storable text: JSON allows a lone surrogate (\\ud800), UTF-8 not."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(
            f"the chat export's {where} holds text that is not valid Unicode (a lone surrogate "
            f"at character {exc.start}): it was damaged; export the chat again"
        ) from exc
    return value


def _parent(m: dict[str, Any], i: int, version: int) -> int | None:
    """Message i's parent (its place in the list): the one before it in a version 1 export."""
    if version == 1:
        return i - 1 if i > 0 else None
    parent = m.get("parent")
    if parent is None:
        return None
    if not isinstance(parent, int) or isinstance(parent, bool) or not 0 <= parent < i:
        raise UsageError(
            f"message {i + 1} of the chat export names parent {parent!r}: a parent must be an "
            "earlier message's place in the list (from 0), or null"
        )
    return parent


def _row(m: object, i: int, version: int, now: float) -> tuple[Any, ...]:
    """(parent place, role, content, status, continues, created, updated, reasoning, tools) of
    message i."""
    if (
        not isinstance(m, dict)
        or m.get("role") not in IMPORT_ROLES
        or not isinstance(m.get("content"), str)
    ):
        raise UsageError(
            f"message {i + 1} of the chat export needs a role ({', '.join(IMPORT_ROLES)}) "
            "and text content"
        )
    status = m.get("status", "complete")
    if status not in IMPORT_STATUSES:
        status = "interrupted" if status == "generating" else "complete"
    continues = m.get("continues", 0)
    if not isinstance(continues, int) or isinstance(continues, bool):
        continues = 0
    created = _time(m.get("created"), now)
    reasoning = m.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise UsageError(f"message {i + 1} of the chat export has a reasoning that is not text")
    try:
        tools = check_stored(m.get("tools"), m["role"], f"message {i + 1} of the chat export")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return (
        _parent(m, i, version),
        m["role"],
        _text(m["content"], f"message {i + 1}"),
        status,
        min(max(continues, 0), MOST_CONTINUES),
        created,
        _time(m.get("updated"), created),
        _text(reasoning, f"message {i + 1}") if reasoning else "",
        _text(tools, f"message {i + 1}"),
    )


def _current(session: dict[str, Any], count: int, version: int) -> int | None:
    """The place of the message the imported session's current path ends at."""
    if not count:
        return None
    current = session.get("current") if version >= 2 else None
    if isinstance(current, int) and not isinstance(current, bool) and 0 <= current < count:
        return current
    return count - 1


def import_json(history: History, text: str) -> int:
    """Store an exported session (JSON from `export_json`) as a new session; returns its id."""
    version, session, messages = _header(text)
    now = time.time()
    rows = [_row(m, i, version, now) for i, m in enumerate(messages)]
    images = [_import_images(history, m, i) for i, m in enumerate(messages)]

    def text_or_none(value: object, where: str = "session") -> str | None:
        return _text(value, where) if isinstance(value, str) else None

    model = text_or_none(session.get("model")) or "imported"
    created = _time(session.get("created"), now)
    current = _current(session, len(rows), version)
    with history.write() as db:
        cur = db.execute(
            "INSERT INTO sessions (created, updated, model, system, title) VALUES (?, ?, ?, ?, ?)",
            (
                created,
                now,
                _text(model, "model name"),
                text_or_none(session.get("system"), "system prompt"),
                text_or_none(session.get("title"), "title"),
            ),
        )
        session_id = int(cur.lastrowid or 0)
        ids: list[int] = []
        for seq, (parent, *fields) in enumerate(rows):
            cur = db.execute(
                "INSERT INTO messages (session_id, seq, parent_id, role, content, status, "
                "continues, created, updated, reasoning, tools, chosen, images) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    seq,
                    None if parent is None else ids[parent],
                    *fields,
                    fields[4],
                    images[seq],
                ),
            )
            ids.append(int(cur.lastrowid or 0))
        leaf = None if current is None else ids[current]
        db.execute("UPDATE sessions SET leaf_id=? WHERE id=?", (leaf, session_id))
    if leaf is not None:
        history.switch_to(leaf)  # the current path's messages are the ones chosen last
    return session_id
