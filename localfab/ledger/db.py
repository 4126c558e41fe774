"""The ledger database: one SQLite table of generations, written without ever failing a reply.

WAL mode, one short transaction per row with a short lock timeout; a locked, corrupt or full
database skips the row and notes why in a small side file that `localfab stats` and `localfab
doctor` show. `LedgerWriter` moves the writes to a thread of their own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import queue
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from localfab.ledger.rows import Row

log = logging.getLogger("localfab.ledger")

LEDGER_FILE = "ledger.sqlite3"
SCHEMA_VERSION = 1
# How long a write waits for another writer before the row is skipped (seconds).
LOCK_TIMEOUT_S = 0.05


def ledger_path(data_dir: Path) -> Path:
    """The ledger database in the data folder."""
    return data_dir / LEDGER_FILE


_COLUMNS = """
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    day TEXT NOT NULL,
    frontend TEXT NOT NULL,
    model TEXT NOT NULL,
    model_path TEXT NOT NULL DEFAULT '',
    model_size INTEGER,
    model_sha256 TEXT,
    label TEXT NOT NULL DEFAULT '',
    depth INTEGER,
    plan_key TEXT NOT NULL,
    n_gpu_layers INTEGER NOT NULL,
    n_ctx INTEGER NOT NULL,
    type_k TEXT NOT NULL,
    type_v TEXT NOT NULL,
    flash_attn TEXT NOT NULL,
    threads INTEGER NOT NULL,
    spec_mode TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    generated_tokens INTEGER NOT NULL,
    ttft_ms REAL,
    itl_p50_ms REAL,
    itl_p99_ms REAL,
    decode_tok_s REAL,
    peak_memory TEXT NOT NULL,
    energy_j REAL,
    tokens_per_j REAL,
    energy_source TEXT NOT NULL DEFAULT '',
    energy_note TEXT NOT NULL DEFAULT ''
"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS generations ({_COLUMNS});
CREATE INDEX IF NOT EXISTS generations_at ON generations(at);
CREATE TABLE IF NOT EXISTS model_hashes (
    path TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, sha256 TEXT NOT NULL,
    PRIMARY KEY (path, size, mtime_ns)
);
"""


class Ledger:
    """The ledger database; `record()` never raises and never waits long."""

    def __init__(self, path: Path, *, timeout: float = LOCK_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.last_error: str | None = None
        self._ready = False

    @property
    def skip_file(self) -> Path:
        return self.path.with_name(self.path.name + ".skipped.json")

    def connect(self) -> sqlite3.Connection:
        """A connection with the ledger's settings (WAL, short lock wait)."""
        return sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)

    @contextlib.contextmanager
    def _open(self) -> Iterator[sqlite3.Connection]:
        conn = self.connect()
        try:
            if not self._ready:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(SCHEMA)
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                self._ready = True
            conn.execute("PRAGMA synchronous=NORMAL")
            yield conn
        finally:
            conn.close()

    def record(self, row: Row) -> bool:
        """Append one row in one short transaction. On any database fault the row is skipped,
        the reason kept in `last_error` and the side file, and False returned."""
        values = row.columns()
        names = ", ".join(values)
        marks = ", ".join(f":{k}" for k in values)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._open() as conn:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.execute(f"INSERT INTO generations ({names}) VALUES ({marks})", values)
                    conn.execute("COMMIT")
                except BaseException:
                    # SQLite may have rolled back already (a full disk does): keep the cause.
                    if conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            conn.execute("ROLLBACK")
                    raise
        except (sqlite3.Error, OSError) as exc:
            self._note_skip(exc)
            return False
        return True

    def _note_skip(self, exc: BaseException) -> None:
        reason = describe_fault(exc, self.path)
        self.last_error = reason
        log.warning("the ledger skipped a row: %s", reason)
        with contextlib.suppress(OSError, ValueError):
            old = json.loads(self.skip_file.read_text()) if self.skip_file.is_file() else {}
            count = int(old.get("skipped", 0)) + 1
            self.skip_file.write_text(
                json.dumps({"skipped": count, "reason": reason, "at": time.time()})
            )

    def skipped(self) -> dict[str, Any] | None:
        """{"skipped": n, "reason": ..., "at": ...} when rows were skipped, else None."""
        try:
            data = json.loads(self.skip_file.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def rows(self, *, since: float | None = None, model: str | None = None) -> list[dict[str, Any]]:
        """Rows, oldest first, optionally from `since` (epoch seconds) and for one model
        (matched by name or as a substring of its name or path). Raises sqlite3.Error."""
        if not self.path.exists():
            return []
        sql = "SELECT * FROM generations WHERE at >= ?"
        args: list[Any] = [since or 0.0]
        if model:
            sql += " AND (model = ? OR instr(model, ?) > 0 OR instr(model_path, ?) > 0)"
            args += [model, model, model]
        uri = f"file:{self.path}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, timeout=1.0)
        try:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute(sql + " ORDER BY at, id", args)]
        finally:
            conn.close()

    def fill_hashes(self, *, limit_bytes: int | None = None) -> int:
        """Compute the sha256 of models whose rows lack it (off the reply path: `stats` and
        `bench` call this). Returns the rows updated; a fault leaves them as they are."""
        try:
            with self._open() as conn:
                todo = conn.execute(
                    "SELECT DISTINCT model_path FROM generations "
                    "WHERE model_sha256 IS NULL AND model_path != ''"
                ).fetchall()
                updated = 0
                for (path,) in todo:
                    digest = self._hash(conn, Path(path), limit_bytes)
                    if digest:
                        cur = conn.execute(
                            "UPDATE generations SET model_sha256 = ? "
                            "WHERE model_path = ? AND model_sha256 IS NULL",
                            (digest, path),
                        )
                        updated += cur.rowcount
                return updated
        except (sqlite3.Error, OSError) as exc:
            self.last_error = describe_fault(exc, self.path)
            return 0

    def _hash(self, conn: sqlite3.Connection, path: Path, limit: int | None) -> str | None:
        try:
            st = path.stat()
        except OSError:
            return None
        key = (str(path), st.st_size, st.st_mtime_ns)
        hit = conn.execute(
            "SELECT sha256 FROM model_hashes WHERE path = ? AND size = ? AND mtime_ns = ?", key
        ).fetchone()
        if hit:
            return str(hit[0])
        if limit is not None and st.st_size > limit:
            return None
        digest = sha256_file(path)
        conn.execute("INSERT OR REPLACE INTO model_hashes VALUES (?, ?, ?, ?)", (*key, digest))
        return digest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def describe_fault(exc: BaseException, path: Path) -> str:
    """A database fault in words, with what to do about it."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return f"{path} was locked by another writer for over {LOCK_TIMEOUT_S:g} s"
    if "full" in text or getattr(exc, "errno", None) == 28:
        return f"{path}: the disk is full; free some space"
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return f"{path} is corrupt ({text}); move it aside (mv {path} {path}.bad) to start anew"
    return f"{path}: {text}"


class LedgerWriter:
    """Rows written by one background thread, for front ends whose replies must not wait on the
    disk at all (the server's event loop, the chat app). `close()` writes what is queued."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._queue: queue.SimpleQueue[Row | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="localfab-ledger", daemon=True)
        self._thread.start()

    def submit(self, row: Row) -> None:
        self._queue.put(row)

    def _run(self) -> None:
        while (row := self._queue.get()) is not None:
            self.ledger.record(row)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


# Numeric columns: the ones every reply has, and the measurements a reply may lack (NULL).
_REQUIRED_NUMBERS = ("at", "prompt_tokens", "cached_tokens", "generated_tokens")
_OPTIONAL_NUMBERS = (
    "n_gpu_layers",
    "n_ctx",
    "threads",
    "model_size",
    "depth",
    "ttft_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "decode_tok_s",
    "energy_j",
    "tokens_per_j",
)


def _number(value: Any) -> float | int | None:
    """A column's value as a finite number, or None (text in a hand-edited file, NaN, inf)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def clean_rows(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Rows as dicts with their numbers checked, and how many were left out.

    SQLite keeps whatever a hand-edited or damaged file puts in a column. A measurement that is
    not a finite number counts as not measured (as NULL does); a row whose token counts or
    time are not numbers is left out and counted."""
    out = []
    damaged = 0
    for r in rows:
        d = dict(r)
        required = [_number(d.get(k)) for k in _REQUIRED_NUMBERS]
        if any(v is None or v < 0 for v in required):
            damaged += 1
            continue
        for key, value in zip(_REQUIRED_NUMBERS, required, strict=True):
            d[key] = value if key == "at" else int(value or 0)
        for key in _OPTIONAL_NUMBERS:
            if key in d:
                d[key] = _number(d[key])
        memory: Any = {}
        with contextlib.suppress(TypeError, ValueError, RecursionError):
            memory = json.loads(d.get("peak_memory") or "{}")
        if not isinstance(memory, dict):
            memory = {}
        d["peak_memory"] = {
            str(k): int(v) for k, v in memory.items() if isinstance(_number(v), int | float)
        }
        for key in ("day", "model", "frontend", "label", "plan_key", "energy_source"):
            if key in d and not isinstance(d[key], str):
                d[key] = "" if d[key] is None else str(d[key])
        out.append(d)
    return out, damaged


def rows_to_dicts(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows as dicts with their numbers checked; damaged rows are left out (`clean_rows`)."""
    return clean_rows(rows)[0]


def ledger_status(ledger: Ledger) -> dict[str, Any]:
    """What `doctor` says about the ledger: where it is, how many rows, and skipped rows."""
    status: dict[str, Any] = {"path": str(ledger.path), "rows": 0, "error": None}
    status["skipped"] = ledger.skipped()
    if ledger.path.exists():
        try:
            uri = f"file:{ledger.path}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, timeout=1.0)
            try:
                status["rows"] = conn.execute("SELECT count(*) FROM generations").fetchone()[0]
            finally:
                conn.close()
        except sqlite3.Error as exc:
            status["error"] = describe_fault(exc, ledger.path)
    summary = f"{ledger.path}: {status['rows']} replies recorded"
    if status["error"]:
        summary = f"cannot be read: {status['error']}"
    skipped = status["skipped"]
    if skipped:
        summary += f"; {skipped.get('skipped')} not recorded, last because {skipped.get('reason')}"
    status["summary"] = summary
    return status
