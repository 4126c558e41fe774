"""Searching the chat history: the FTS5 index where SQLite has it, a LIKE scan where not.

A hit carries a snippet with the matches between `HIT_START` and `HIT_END` (control characters,
never in chat text shown as such); `split_hits` cuts a snippet into pieces for display.

What was typed is bounded before it reaches SQLite (`search_terms`): each word costs a pass over
its part of the index, so a pasted paragraph is searched by its first few distinct words, which
find its message as surely as all of them would.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

# Said once where this Python's SQLite lacks FTS5 (search still works, by LIKE).
NO_FTS_NOTICE = (
    "This Python's SQLite has no FTS5, so search scans every message (LIKE) instead of "
    "using a full-text index: it works, more slowly on a large history."
)

FTS_TABLE = "messages_fts"

# Only this much of a query is read: more is a pasted document, not words to look for.
MAX_QUERY_CHARS = 1000
# At most this many distinct words are searched for, a word such as "a.b" counting once per
# token the index splits it into (FTS5 matches it as a phrase of those tokens).
MAX_TERMS = 10

# Control characters (NUL ends an FTS5 string early) separate words, as the index's tokenizer
# treats them.
_SEPARATORS = re.compile("[\x00-\x1f\x7f-\x9f]")
# A lone UTF-16 surrogate cannot be encoded, so no stored message holds one.
_SURROGATE = re.compile("[\ud800-\udfff]")
# The tokens FTS5's unicode61 tokenizer makes of a word, near enough to count them.
_TOKEN = re.compile(r"[^\W_]+")

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


class SearchCancelled(Exception):
    """A search stopped before it finished, because whoever asked no longer wants its hits."""


@dataclass(frozen=True)
class SearchTerms:
    """The words a search looks for: what was typed, bounded (see `search_terms`)."""

    words: tuple[str, ...]
    prefix: bool  # the last word also matches as the start of a longer word (still being typed)
    capped: bool  # words past `MAX_QUERY_CHARS` or `MAX_TERMS` were left out


def search_terms(query: str) -> SearchTerms:
    """The distinct words of `query` (first spelling kept), at most `MAX_TERMS` tokens' worth.

    The last word is a prefix when it is the query's last (one cut short by `MAX_QUERY_CHARS`
    included) and new. Control characters separate words. A query with a word no message can
    hold (a lone surrogate) has no words, so it finds nothing instead of failing in SQLite.
    """
    typed = _SEPARATORS.sub(" ", query[:MAX_QUERY_CHARS]).split()
    words: list[str] = []
    seen: set[str] = set()
    budget = MAX_TERMS
    prefix, capped = False, len(query) > MAX_QUERY_CHARS
    for i, word in enumerate(typed):
        if word.casefold() in seen:
            continue
        tokens = list(_TOKEN.finditer(word))
        if len(tokens) > budget or budget == 0:
            capped = True
            if not words:  # one long "a.b.c..." word: its first tokens still narrow the search
                words.append(word[: tokens[budget - 1].end()])
            break
        budget -= max(1, len(tokens))
        seen.add(word.casefold())
        words.append(word)
        prefix = i == len(typed) - 1
    if any(_SURROGATE.search(word) for word in words):
        return SearchTerms((), prefix=False, capped=capped)
    return SearchTerms(tuple(words), prefix=prefix, capped=capped)


def search_fts(db: sqlite3.Connection, terms: SearchTerms, limit: int) -> list[SearchHit]:
    """Messages holding every word (the last as a prefix if so marked), ranked by bm25."""
    # Every word quoted, so that what the user typed is never read as FTS5 query syntax.
    quoted = ['"' + w.replace('"', '""') + '"' for w in terms.words]
    if terms.prefix:
        quoted[-1] += "*"
    rows = db.execute(
        f"SELECT m.session_id, m.id, m.role, s.title, "
        f"snippet({FTS_TABLE}, 0, ?, ?, '…', ?) "
        f"FROM {FTS_TABLE} "
        f"JOIN messages m ON m.id = {FTS_TABLE}.rowid "
        f"JOIN sessions s ON s.id = m.session_id "
        f"WHERE {FTS_TABLE} MATCH ? ORDER BY rank LIMIT ?",
        (HIT_START, HIT_END, SNIPPET_TOKENS, " ".join(quoted), limit),
    ).fetchall()
    return [SearchHit(*r) for r in rows]


def search_like(
    db: sqlite3.Connection, terms: SearchTerms, limit: int, *, column: str = "content"
) -> list[SearchHit]:
    """Messages holding every word, newest first, by a LIKE scan (SQLite without FTS5; and
    the thoughts, `column` "reasoning", which have no index)."""
    words = list(terms.words)

    def escape(word: str) -> str:
        return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")

    assert column in ("content", "reasoning")
    where = " AND ".join([f"m.{column} LIKE ? ESCAPE '\\'"] * len(words))
    rows = db.execute(
        f"SELECT m.session_id, m.id, m.role, s.title, m.{column} FROM messages m "
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


class SearchPool:
    """Read-only connections for searches, each serving one search at a time.

    Not the shared connection, and without its lock: in WAL mode a reader sees the last
    committed state while writers go on, so nothing waits for a search. Up to `keep` idle
    connections stay open for the next searches.
    """

    def __init__(self, path: Path, timeout: float, keep: int) -> None:
        self.path = path
        self.timeout = timeout
        self.keep = keep
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(
        self, cancelled: Callable[[], bool] | None, check_steps: int
    ) -> Iterator[sqlite3.Connection]:
        """A connection for one search, taken from the idle ones or opened; `cancelled` is
        asked every `check_steps` SQLite VM steps, and True stops the query."""
        with self._lock:
            db = self._idle.pop() if self._idle else None
        if db is None:
            db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=self.timeout
            )
            db.execute("PRAGMA query_only=ON")
        if cancelled is not None:
            db.set_progress_handler(lambda: bool(cancelled()), check_steps)
        try:
            yield db
        finally:
            db.set_progress_handler(None, 0)
            with self._lock:
                keep = not self._closed and len(self._idle) < self.keep
                if keep:
                    self._idle.append(db)
            if not keep:
                db.close()

    def close(self) -> None:
        """Close the idle connections; one still searching closes when its search ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()
