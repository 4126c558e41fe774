"""The usage ledger: one SQLite row per generation, from every front end.

Each row holds when and where a reply was made, the model (and its sha256 when known), the plan
it ran with, token counts, the four baseline numbers (decode tok/s, token-to-token latency p50
and p99, peak memory, energy) and the energy's source. A request's text is never stored.

Writing never fails or slows a reply: the database is in WAL mode, each row is one short
transaction with a short lock timeout, and a locked, corrupt or full database skips the row and
notes why in a small side file that `localfab stats` and `localfab doctor` show.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import resource
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from localfab.energy import Energy, EnergyMeter

log = logging.getLogger("localfab.ledger")

LEDGER_FILE = "ledger.sqlite3"
SCHEMA_VERSION = 1
# How long a write waits for another writer before the row is skipped (seconds).
LOCK_TIMEOUT_S = 0.05
FRONT_ENDS = ("run", "chat", "serve", "bench")


def ledger_path(data_dir: Path) -> Path:
    """The ledger database in the data folder."""
    return data_dir / LEDGER_FILE


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation, as numpy's default; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class TokenClock:
    """Arrival times of a reply's tokens, kept by the caller: one clock read per token."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tick = self.times.append  # bound once: the per-token cost is one append

    def now(self) -> None:
        self.tick(time.perf_counter())

    @property
    def intervals_ms(self) -> list[float]:
        t = self.times
        return [(b - a) * 1e3 for a, b in zip(t, t[1:], strict=False)]

    def decode_tok_s(self) -> float | None:
        if len(self.times) < 2 or self.times[-1] <= self.times[0]:
            return None
        return (len(self.times) - 1) / (self.times[-1] - self.times[0])


class PlanLike(Protocol):
    n_gpu_layers: int
    n_ctx: int
    type_k: str
    type_v: str


@dataclass(frozen=True)
class PlanInfo:
    """The plan columns of a row, from a `Plan` or an `EngineSettings`."""

    n_gpu_layers: int
    n_ctx: int
    type_k: str
    type_v: str
    flash_attn: str
    threads: int
    spec_mode: str = "off"

    @classmethod
    def of(cls, plan: Any, *, spec_mode: str = "off") -> PlanInfo:
        fa = getattr(plan, "flash_attn", "auto")
        if isinstance(fa, bool):
            fa = "on" if fa else "off"
        threads: Any = getattr(plan, "threads", None)
        if threads is None:
            threads = getattr(plan, "n_threads", 0)
        return cls(
            n_gpu_layers=int(plan.n_gpu_layers),
            n_ctx=int(plan.n_ctx),
            type_k=str(plan.type_k),
            type_v=str(plan.type_v),
            flash_attn=str(fa),
            threads=int(threads),
            spec_mode=spec_mode,
        )

    @property
    def key(self) -> str:
        """A short stable id for `stats --compare`."""
        text = "|".join(str(v) for v in asdict(self).values())
        return "p" + hashlib.sha1(text.encode()).hexdigest()[:6]

    def describe(self) -> str:
        return (
            f"ngl {self.n_gpu_layers}, ctx {self.n_ctx}, kv {self.type_k}/{self.type_v}, "
            f"fa {self.flash_attn}, {self.threads} threads, spec {self.spec_mode}"
        )


@dataclass(frozen=True)
class Row:
    """One generation as the ledger stores it (never the request's text)."""

    frontend: str
    model: str
    plan: PlanInfo
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    ttft_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    decode_tok_s: float | None
    peak_memory: Mapping[str, int] = field(default_factory=dict)
    energy_j: float | None = None
    tokens_per_j: float | None = None
    energy_source: str = ""
    energy_note: str = ""
    model_path: str = ""
    model_size: int | None = None
    model_sha256: str | None = None
    label: str = ""  # a bench baseline's label
    depth: int | None = None  # a bench row's context depth
    at: float = field(default_factory=time.time)

    def columns(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "plan"}
        values |= asdict(self.plan)
        values["plan_key"] = self.plan.key
        values["peak_memory"] = json.dumps(dict(self.peak_memory), sort_keys=True)
        values["day"] = time.strftime("%Y-%m-%d", time.localtime(self.at))
        return values


def timing_fields(clock: TokenClock | None, timings: Any) -> dict[str, float | None]:
    """TTFT, latency p50/p99 and decode tok/s from a clock (preferred) or engine timings."""
    ttft = float(timings.ttft_ms) if timings is not None else None
    if clock is not None and len(clock.times) >= 2:
        gaps = clock.intervals_ms
        return {
            "ttft_ms": ttft,
            "itl_p50_ms": percentile(gaps, 50),
            "itl_p99_ms": percentile(gaps, 99),
            "decode_tok_s": clock.decode_tok_s(),
        }
    per_s = getattr(timings, "predicted_per_second", 0.0) if timings is not None else 0.0
    per_tok = getattr(timings, "predicted_per_token_ms", 0.0) if timings is not None else 0.0
    return {
        "ttft_ms": ttft,
        "itl_p50_ms": per_tok or None,
        "itl_p99_ms": None,
        "decode_tok_s": per_s or None,
    }


def peak_memory(drm_root: str | Path = "/sys/class/drm", nvml: Any | None = None) -> dict[str, int]:
    """Peak memory per device in bytes: this process's peak RSS, and GPU memory in use now
    (llama.cpp allocates its GPU buffers at load, so the use after a reply is its peak)."""
    result = {"ram": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if nvml is not None:
        with contextlib.suppress(Exception):
            for i in range(int(nvml.nvmlDeviceGetCount())):
                info = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i))
                result[f"cuda{i}"] = int(info.used)
    base = Path(drm_root)
    for card in sorted(base.glob("card[0-9]*")) if base.is_dir() else []:
        used = 0
        for name in ("mem_info_vram_used", "mem_info_gtt_used"):
            with contextlib.suppress(OSError, ValueError):
                used += int((card / "device" / name).read_text())
        if used:
            result[f"amdgpu:{card.name}"] = used
    return result


def build_row(
    *,
    frontend: str,
    model: str,
    plan: Any,
    timings: Any,
    prompt_tokens: int,
    generated_tokens: int,
    clock: TokenClock | None = None,
    energy: Energy | None = None,
    memory: Mapping[str, int] | None = None,
    model_path: str | Path = "",
    spec_mode: str = "off",
    label: str = "",
    depth: int | None = None,
) -> Row:
    """A ledger row from what a front end has at the end of a reply: the engine's `Timings`
    (or the first piece's for a continued reply), the plan (`Plan` or `EngineSettings`), the
    token clock it ticked, and the energy measurement that wrapped the reply."""
    size = None
    if model_path:
        with contextlib.suppress(OSError):
            size = Path(model_path).stat().st_size
    figures = timing_fields(clock, timings)
    energy = energy or Energy(None, "", "not measured")
    return Row(
        frontend=frontend,
        model=model,
        plan=PlanInfo.of(plan, spec_mode=spec_mode),
        prompt_tokens=prompt_tokens,
        cached_tokens=int(getattr(timings, "cache_n", 0) or 0),
        generated_tokens=generated_tokens,
        peak_memory=dict(memory if memory is not None else peak_memory()),
        energy_j=energy.joules,
        tokens_per_j=energy.tokens_per_joule(generated_tokens),
        energy_source=energy.source,
        energy_note=energy.note,
        model_path=str(model_path),
        model_size=size,
        label=label,
        depth=depth,
        ttft_ms=figures["ttft_ms"],
        itl_p50_ms=figures["itl_p50_ms"],
        itl_p99_ms=figures["itl_p99_ms"],
        decode_tok_s=figures["decode_tok_s"],
    )


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


def ledger_enabled(config: Any, env: Mapping[str, str] | None = None) -> bool:
    """The `ledger` setting (config.toml or LOCALFAB_LEDGER); on unless turned off."""
    raw = (os.environ if env is None else env).get("LOCALFAB_LEDGER")
    if raw is not None:
        return raw.strip().lower() not in ("0", "false", "no", "off")
    return bool(getattr(config, "ledger", True))


def rows_to_dicts(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        d = dict(r)
        with contextlib.suppress(TypeError, ValueError):
            d["peak_memory"] = json.loads(d.get("peak_memory") or "{}")
        out.append(d)
    return out


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


def record_generation(
    sink: Ledger | LedgerWriter | None,
    *,
    frontend: str,
    model: str,
    plan: Any,
    timings: Any,
    prompt_tokens: int,
    generated_tokens: int,
    clock: TokenClock | None = None,
    energy: Energy | None = None,
    model_path: str | Path = "",
    spec_mode: str = "off",
) -> Row | None:
    """The hook every front end calls once a reply has ended: one ledger row from the engine's
    `Timings`, the plan (`Plan` or `EngineSettings`), and, when kept, the token clock and the
    energy measurement that wrapped the reply. A `LedgerWriter` sink queues the row (nothing
    waits on the disk); a `Ledger` writes it now; None (the ledger turned off) does nothing.
    Never raises: a row that cannot be built is skipped with a warning."""
    if sink is None:
        return None
    try:
        row = build_row(
            frontend=frontend,
            model=model,
            plan=plan,
            timings=timings,
            prompt_tokens=prompt_tokens,
            generated_tokens=generated_tokens,
            clock=clock,
            energy=energy,
            model_path=model_path,
            spec_mode=spec_mode,
        )
    except Exception as exc:  # a reply is never failed by its bookkeeping
        log.warning("the ledger skipped a row: %s", exc)
        return None
    if isinstance(sink, LedgerWriter):
        sink.submit(row)
    else:
        sink.record(row)
    return row


class ReplyRecorder:
    """Wraps a chat reply's event stream (`ChatSession.send`/`complete`/...): ticks a token clock
    per token, measures the reply's energy, and at the reply's end writes its ledger row with
    `record_generation`. Events pass through unchanged; `energy` and `row` hold the last reply's
    figures (for a status bar or `--json`). The chat app and `run` use it the same way."""

    def __init__(
        self,
        sink: Ledger | LedgerWriter | None,
        *,
        frontend: str,
        model: str,
        plan: Any,
        meter: EnergyMeter | None = None,
        model_path: str | Path = "",
    ) -> None:
        self.sink = sink
        self.frontend = frontend
        self.model = model
        self.plan = plan
        self.meter = meter if meter is not None else EnergyMeter([])
        self.model_path = model_path
        self.energy: Energy | None = None
        self.row: Row | None = None
        self.clock = TokenClock()

    def wrap(self, events: Iterable[Any], *, prompt_tokens: int | None = None) -> Iterator[Any]:
        from localfab.engine.types import TokenEvent

        self.clock = clock = TokenClock()
        tick, now = clock.tick, time.perf_counter
        reply = None
        measured = self.meter.measure()
        with measured:
            for event in events:
                if isinstance(event, TokenEvent):
                    tick(now())
                elif hasattr(event, "pieces"):  # the chat session's Reply
                    reply = event
                    break
                yield event
        self.energy = measured.energy
        if reply is None:
            return
        first = reply.pieces[0] if reply.pieces else None
        self.row = record_generation(
            self.sink,
            frontend=self.frontend,
            model=self.model,
            plan=self.plan,
            timings=reply.timings,
            prompt_tokens=prompt_tokens if prompt_tokens is not None else _prompt_tokens(first),
            generated_tokens=reply.completion_tokens,
            clock=clock,
            energy=self.energy,
            model_path=self.model_path,
        )
        yield reply


def _prompt_tokens(done: Any) -> int:
    return int(done.prompt_tokens) if done is not None else 0
