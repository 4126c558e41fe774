"""The usage ledger: one SQLite row per generation, from every front end.

Each row holds when and where a reply was made, the model (and its sha256 when known), the plan
it ran with, token counts, the four baseline numbers (decode tok/s, token-to-token latency p50
and p99, peak memory, energy) and the energy's source. A request's text is never stored.

Writing never fails or slows a reply: the database is in WAL mode, each row is one short
transaction with a short lock timeout, and a locked, corrupt or full database skips the row and
notes why in a small side file that `localfab stats` and `localfab doctor` show.

What a row holds and how it is built is in `ledger_rows`, the database in `ledger_db`; this
module holds what the front ends call (`record_generation`, `ReplyRecorder`, `ledger_enabled`)
and keeps every name importable from here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from localfab.ledger.db import (
    LEDGER_FILE,
    LOCK_TIMEOUT_S,
    SCHEMA,
    SCHEMA_VERSION,
    Ledger,
    LedgerWriter,
    clean_rows,
    describe_fault,
    ledger_path,
    ledger_status,
    rows_to_dicts,
    sha256_file,
)
from localfab.ledger.rows import (
    PlanInfo,
    PlanLike,
    Row,
    TokenClock,
    build_row,
    peak_memory,
    percentile,
    timing_fields,
)
from localfab.machine.energy import Energy, EnergyMeter

__all__ = [
    "FRONT_ENDS",
    "LEDGER_FILE",
    "LOCK_TIMEOUT_S",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Ledger",
    "LedgerWriter",
    "PlanInfo",
    "PlanLike",
    "ReplyRecorder",
    "Row",
    "TokenClock",
    "build_row",
    "describe_fault",
    "ledger_enabled",
    "ledger_path",
    "ledger_status",
    "peak_memory",
    "percentile",
    "record_generation",
    "rows_to_dicts",
    "clean_rows",
    "sha256_file",
    "timing_fields",
]

log = logging.getLogger("localfab.ledger")

FRONT_ENDS = ("run", "chat", "serve", "bench")


def ledger_enabled(config: Any, env: Mapping[str, str] | None = None) -> bool:
    """The `ledger` setting (config.toml or LOCALFAB_LEDGER); on unless turned off."""
    raw = (os.environ if env is None else env).get("LOCALFAB_LEDGER")
    if raw is not None:
        return raw.strip().lower() not in ("0", "false", "no", "off")
    return bool(getattr(config, "ledger", True))


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
