"""`localfab stats`: what the usage ledger says about speed, latency, memory and energy."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import click

from localfab.errors import LocalfabError
from localfab.textsafe import visible_controls


def _echo(text: str) -> None:
    """Print a line of the report: a damaged ledger's text (a model name, a day) may hold
    control characters, which are shown, never sent to the terminal."""
    click.echo(visible_controls(text))


@click.command("stats")
@click.option("--since", default=None, help="From a date (2026-05-01) or an age (7d, 12h, 30m).")
@click.option("--model", default=None, help="Only this model (its name, or part of its path).")
@click.option(
    "--compare",
    nargs=2,
    default=None,
    metavar="A B",
    help="Two baselines (bench labels) or plans (ids shown under 'By plan') side by side.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def stats(
    since: str | None, model: str | None, compare: tuple[str, str] | None, as_json: bool
) -> None:
    """Totals and medians per model, plan and day from the usage ledger.

    Every reply of `run`, `serve` and the chat app is a row: tokens, TTFT, token-to-token
    latency (p50, p99), decode tok/s, peak memory and, where this machine reads power, energy.
    """
    from localfab.config import default_paths
    from localfab.ledger import report as lr
    from localfab.ledger.writer import Ledger, clean_rows, ledger_path

    ledger = Ledger(ledger_path(default_paths().data_dir))
    start = lr.parse_since(since) if since else None
    if ledger.path.exists():
        ledger.fill_hashes()  # off the reply path: hashes are computed once and cached
    try:
        rows, damaged = clean_rows(ledger.rows(since=start, model=model))
    except sqlite3.Error as exc:
        from localfab.ledger.writer import describe_fault

        raise LocalfabError(f"cannot read the ledger: {describe_fault(exc, ledger.path)}") from exc
    skipped = ledger.skipped()
    if compare:
        _compare(rows, compare, as_json=as_json)
        return
    summaries = lr.report(rows)
    reasons = lr.energy_reasons(rows)
    if as_json:
        data: dict[str, Any] = {
            "ledger": str(ledger.path),
            "replies": len(rows),
            **{k: [s.to_dict() for s in v] for k, v in summaries.items()},
            "energy_missing": [{"reason": r, "replies": n} for r, n in reasons],
            "skipped": skipped,
            "damaged": damaged,
        }
        _echo(json.dumps(data, indent=2))
        return
    _echo(f"Ledger: {ledger.path} ({len(rows)} replies)")
    if damaged:
        _echo(
            f"  ! {damaged} row(s) left out: their token counts or time are not numbers (a "
            f"hand-edited or damaged ledger)"
        )
    if skipped:
        _echo(
            f"  ! {skipped.get('skipped')} repl(ies) were not recorded; last reason: "
            f"{skipped.get('reason')}"
        )
    if not rows:
        _echo("No replies recorded yet" + (" for that selection." if since or model else "."))
        return
    _echo("")
    _echo(lr.render_report(summaries))
    if reasons:
        _echo("\nEnergy not measured")
        for reason, n in reasons:
            _echo(f"  - {n} repl{'y' if n == 1 else 'ies'}: {reason}")


def _compare(rows: list[dict[str, Any]], names: tuple[str, str], *, as_json: bool) -> None:
    from localfab.ledger import report as lr

    name_a, rows_a = lr.select(rows, names[0])
    name_b, rows_b = lr.select(rows, names[1])
    a, b = lr.summarize(names[0], rows_a), lr.summarize(names[1], rows_b)
    if as_json:
        data = {
            "a": {"name": name_a} | a.to_dict(),
            "b": {"name": name_b} | b.to_dict(),
            "changes": lr.compare(a, b),
        }
        _echo(json.dumps(data, indent=2))
        return
    _echo(lr.render_compare(name_a, name_b, a, b))
