"""The usage ledger on real SQLite: rows, WAL, and locked, corrupt and full databases."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from localfab.engine.types import EngineSettings, Timings
from localfab.ledger.writer import (
    Ledger,
    LedgerWriter,
    PlanInfo,
    Row,
    TokenClock,
    build_row,
    ledger_enabled,
    ledger_status,
    percentile,
    record_generation,
    rows_to_dicts,
)
from localfab.machine.energy import Energy

PLAN = PlanInfo(n_gpu_layers=0, n_ctx=4096, type_k="f16", type_v="f16", flash_attn="on", threads=2)


def row(**changes: object) -> Row:
    values: dict[str, object] = {
        "frontend": "run",
        "model": "tiny",
        "plan": PLAN,
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "generated_tokens": 20,
        "ttft_ms": 100.0,
        "itl_p50_ms": 25.0,
        "itl_p99_ms": 40.0,
        "decode_tok_s": 40.0,
        "peak_memory": {"ram": 1 << 30},
    }
    values.update(changes)
    return Row(**values)  # type: ignore[arg-type]


def test_percentile_and_clock() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([10.0, 20.0], 99) == pytest.approx(19.9)
    clock = TokenClock()
    for t in (1.0, 1.02, 1.05, 1.06):
        clock.tick(t)
    assert clock.intervals_ms == pytest.approx([20.0, 30.0, 10.0])
    assert clock.decode_tok_s() == pytest.approx(3 / 0.06)


def test_record_and_read_back_in_wal_mode(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "data" / "ledger.sqlite3")
    assert ledger.rows() == []
    assert ledger.record(row())
    assert ledger.record(row(model="other", energy_j=2.0, tokens_per_j=10.0))
    rows = rows_to_dicts(ledger.rows())
    assert [r["model"] for r in rows] == ["tiny", "other"]
    assert rows[0]["peak_memory"] == {"ram": 1 << 30}
    assert rows[0]["plan_key"] == PLAN.key and rows[0]["flash_attn"] == "on"
    assert rows[1]["energy_j"] == 2.0
    assert [r["model"] for r in ledger.rows(model="oth")] == ["other"]
    conn = sqlite3.connect(ledger.path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_build_row_from_engine_settings_and_timings(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    clock = TokenClock()
    for t in (0.0, 0.01, 0.03, 0.04):
        clock.tick(t)
    settings = EngineSettings(n_ctx=2048, n_gpu_layers=3, n_threads=4, type_k="q8_0")
    built = build_row(
        frontend="serve",
        model="m",
        plan=settings,
        timings=Timings(cache_n=5, prompt_n=7, ttft_ms=50.0, predicted_n=4, predicted_ms=40.0),
        prompt_tokens=12,
        generated_tokens=4,
        clock=clock,
        energy=Energy(2.0, "rapl:package-0"),
        memory={"ram": 5},
        model_path=model,
    )
    assert built.plan == PlanInfo(3, 2048, "q8_0", "f16", "auto", 4)
    assert (built.cached_tokens, built.model_size) == (5, 64)
    assert built.itl_p50_ms == pytest.approx(10.0)
    assert built.decode_tok_s == pytest.approx(3 / 0.04)
    assert built.tokens_per_j == pytest.approx(2.0)
    # Without a clock, the engine's own timings give the decode figures.
    plain = build_row(
        frontend="chat",
        model="m",
        plan=settings,
        timings=Timings(predicted_n=4, predicted_ms=40.0, ttft_ms=9.0),
        prompt_tokens=1,
        generated_tokens=4,
        memory={},
    )
    assert plain.decode_tok_s == pytest.approx(3 / 0.04)  # the first token came with the prompt
    assert plain.itl_p99_ms is None and plain.energy_j is None


def test_locked_ledger_skips_the_row_and_says_why(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    assert ledger.record(row())
    holder = sqlite3.connect(ledger.path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        assert not ledger.record(row(model="lost"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert ledger.last_error is not None and "locked" in ledger.last_error
    skipped = ledger.skipped()
    assert skipped is not None and skipped["skipped"] == 1 and "locked" in skipped["reason"]
    assert ledger.record(row(model="after"))
    assert [r["model"] for r in ledger.rows()] == ["tiny", "after"]
    status = ledger_status(ledger)
    assert status["rows"] == 2 and "1 not recorded" in status["summary"]


def test_corrupt_ledger_is_left_alone_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    garbage = b"this is not sqlite " * 300
    path.write_bytes(garbage)
    ledger = Ledger(path)
    assert not ledger.record(row())
    assert ledger.last_error is not None
    assert "corrupt" in ledger.last_error and ".bad" in ledger.last_error
    assert path.read_bytes() == garbage  # nothing already there is touched
    assert "corrupt" in ledger_status(ledger)["summary"]


class TinyLedger(Ledger):
    """A ledger whose database may not grow past a few pages: SQLite's own 'disk is full'."""

    def connect(self) -> sqlite3.Connection:
        conn = super().connect()
        conn.execute("PRAGMA max_page_count = 8")
        return conn


def test_full_disk_skips_rows_and_keeps_earlier_ones(tmp_path: Path) -> None:
    ledger = TinyLedger(tmp_path / "ledger.sqlite3")
    written = 0
    for i in range(500):
        if not ledger.record(row(model=f"model-{i}-" + "x" * 200)):
            break
        written += 1
    assert 0 < written < 500
    assert ledger.last_error is not None and "disk is full" in ledger.last_error
    assert [r["model"] for r in Ledger(ledger.path).rows()] == [
        f"model-{i}-" + "x" * 200 for i in range(written)
    ]


def test_background_writer_writes_everything_on_close(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    writer = LedgerWriter(ledger)
    for i in range(5):
        writer.submit(row(generated_tokens=i))
    writer.close()
    assert [r["generated_tokens"] for r in ledger.rows()] == [0, 1, 2, 3, 4]


def test_model_hashes_are_filled_off_the_reply_path(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" * 1000)
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.record(row(model_path=str(model)))
    ledger.record(row(model_path=str(tmp_path / "gone.gguf")))
    assert ledger.rows()[0]["model_sha256"] is None
    assert ledger.fill_hashes() == 1
    expected = hashlib.sha256(model.read_bytes()).hexdigest()
    assert [r["model_sha256"] for r in ledger.rows()] == [expected, None]
    ledger.record(row(model_path=str(model)))
    assert ledger.fill_hashes() == 1  # from the cache table: the file is not read again
    assert ledger.rows()[2]["model_sha256"] == expected


def test_ledger_setting() -> None:
    class Cfg:
        ledger = False

    assert ledger_enabled(object(), env={})
    assert not ledger_enabled(Cfg(), env={})
    assert not ledger_enabled(object(), env={"LOCALFAB_LEDGER": "off"})
    assert ledger_enabled(Cfg(), env={"LOCALFAB_LEDGER": "1"})


def test_record_generation_hook(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    settings = EngineSettings(n_ctx=1024)
    timings = Timings(cache_n=3, prompt_n=4, predicted_n=5, predicted_ms=50.0, ttft_ms=12.0)
    common: dict[str, Any] = {
        "frontend": "serve",
        "model": "m",
        "plan": settings,
        "timings": timings,
        "prompt_tokens": 7,
        "generated_tokens": 5,
    }
    assert record_generation(None, **common) is None  # the ledger is turned off
    writer = LedgerWriter(ledger)
    queued = record_generation(writer, **common)
    writer.close()
    written = record_generation(ledger, **common | {"frontend": "chat"})
    assert queued is not None and written is not None
    rows = ledger.rows()
    assert [(r["frontend"], r["cached_tokens"], r["decode_tok_s"]) for r in rows] == [
        ("serve", 3, 80.0),  # 4 decode steps in 50 ms: the first token came with the prompt
        ("chat", 3, 80.0),
    ]
    # Something that is not a plan is skipped, not raised.
    assert record_generation(ledger, **common | {"plan": object()}) is None
    assert len(ledger.rows()) == 2


def test_text_in_a_numeric_column_is_left_out_or_not_measured(tmp_path: Path) -> None:
    """A hand-edited ledger: text where a token count or the time goes leaves the row out (and
    is counted); text in a measurement counts as not measured, as NULL does. `stats` raised
    `ValueError: invalid literal for int()` on such a file."""
    from localfab.ledger import report as lr
    from localfab.ledger.writer import clean_rows

    ledger = Ledger(tmp_path / "ledger.sqlite3")
    for name in ("tiny", "words", "slow", "when"):
        assert ledger.record(row(model=name))
    conn = sqlite3.connect(ledger.path)
    with conn:
        conn.execute("UPDATE generations SET generated_tokens = 'lots' WHERE model = 'words'")
        conn.execute("UPDATE generations SET decode_tok_s = 'fast' WHERE model = 'slow'")
        conn.execute("UPDATE generations SET at = 'yesterday' WHERE model = 'when'")
    conn.close()
    rows, damaged = clean_rows(ledger.rows())
    assert damaged == 2
    assert [(r["model"], r["decode_tok_s"]) for r in rows] == [("tiny", 40.0), ("slow", None)]
    assert rows_to_dicts(ledger.rows()) == rows
    report = lr.render_report(lr.report(rows))
    assert "tiny" in report and "slow" in report and "words" not in report
