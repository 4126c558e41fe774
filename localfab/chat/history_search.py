"""Searching the chat history: the FTS5 index where SQLite has it, a LIKE scan where not.

A hit carries a snippet with the matches between `HIT_START` and `HIT_END` (control characters,
never in chat text shown as such); `split_hits` cuts a snippet into pieces for display.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

FTS_TABLE = "messages_fts"

# Around each hit in a search snippet (control characters, never in chat text shown as such).
HIT_START = "\x02"
HIT_END = "\x03"
SNIPPET_TOKENS = 12


@dataclass(frozen=True)
class SearchHit:
    """A message that matched a search, with a snippet around the match."""

    session_id: int
    message_id: int
    role: str
    title: str | None
    snippet: str  # matches between HIT_START and HIT_END


def search_fts(db: sqlite3.Connection, words: list[str], limit: int) -> list[SearchHit]:
    """Messages holding every word (the last as a prefix), ranked by bm25."""
    # Every word quoted, so that what the user typed is never read as FTS5 query syntax.
    terms = ['"' + w.replace('"', '""') + '"' for w in words]
    terms[-1] += "*"
    rows = db.execute(
        f"SELECT m.session_id, m.id, m.role, s.title, "
        f"snippet({FTS_TABLE}, 0, ?, ?, '…', ?) "
        f"FROM {FTS_TABLE} "
        f"JOIN messages m ON m.id = {FTS_TABLE}.rowid "
        f"JOIN sessions s ON s.id = m.session_id "
        f"WHERE {FTS_TABLE} MATCH ? ORDER BY rank LIMIT ?",
        (HIT_START, HIT_END, SNIPPET_TOKENS, " ".join(terms), limit),
    ).fetchall()
    return [SearchHit(*r) for r in rows]


def search_like(db: sqlite3.Connection, words: list[str], limit: int) -> list[SearchHit]:
    """Messages holding every word, newest first, by a LIKE scan (SQLite without FTS5)."""

    def escape(word: str) -> str:
        return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")

    where = " AND ".join(["m.content LIKE ? ESCAPE '\\'"] * len(words))
    rows = db.execute(
        f"SELECT m.session_id, m.id, m.role, s.title, m.content FROM messages m "
        f"JOIN sessions s ON s.id = m.session_id WHERE {where} "
        f"ORDER BY m.updated DESC LIMIT ?",
        (*[f"%{escape(w)}%" for w in words], limit),
    ).fetchall()
    return [
        SearchHit(session_id, message_id, role, title, like_snippet(content, words))
        for session_id, message_id, role, title, content in rows
    ]


def like_snippet(content: str, words: list[str], *, width: int = 80) -> str:
    """A snippet around the first word found, every word's matches marked (the LIKE fallback)."""
    text = " ".join(content.split())
    lower = text.lower()
    found = [i for i in (lower.find(w.lower()) for w in words) if i >= 0]
    first = min(found) if found else 0
    start = max(0, first - width // 3)
    piece = text[start : start + width]
    marked = piece
    for word in sorted({w for w in words if w}, key=len, reverse=True):
        out, i, low = [], 0, marked.lower()
        key = word.lower()
        while (j := low.find(key, i)) >= 0:
            out.append(marked[i:j] + HIT_START + marked[j : j + len(word)] + HIT_END)
            i = j + len(word)
        out.append(marked[i:])
        marked = "".join(out)
    prefix = "…" if start > 0 else ""
    suffix = "…" if start + width < len(text) else ""
    return prefix + marked + suffix


def split_hits(snippet: str) -> list[tuple[str, bool]]:
    """A snippet as (text, is_match) pieces, for display."""
    pieces: list[tuple[str, bool]] = []
    rest = snippet
    while rest:
        start = rest.find(HIT_START)
        if start < 0:
            pieces.append((rest, False))
            break
        if start:
            pieces.append((rest[:start], False))
        end = rest.find(HIT_END, start + 1)
        end = len(rest) if end < 0 else end
        pieces.append((rest[start + 1 : end], True))
        rest = rest[end + 1 :]
    return [(text, hit) for text, hit in pieces if text]
