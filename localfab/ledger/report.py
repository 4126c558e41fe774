"""Summaries of the usage ledger: totals and medians per model, plan and day; two baselines side
by side. Pure functions over ledger rows (dicts), shared by `localfab stats` and `localfab bench`.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from localfab.errors import UsageError
from localfab.units import format_bytes

Row = Mapping[str, Any]


def _median(rows: Iterable[Row], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _peak(row: Row) -> int:
    memory = row.get("peak_memory") or {}
    return sum(int(v) for v in memory.values()) if isinstance(memory, Mapping) else 0


@dataclass(frozen=True)
class Summary:
    """One group of rows: totals, and the medians of the four baseline numbers."""

    key: str
    replies: int
    prompt_tokens: int
    generated_tokens: int
    decode_tok_s: float | None  # median
    ttft_ms: float | None  # median
    itl_p50_ms: float | None  # median over replies of each reply's median interval
    itl_p99_ms: float | None  # median over replies of each reply's p99 interval
    peak_memory: int  # the largest total over devices of any reply
    energy_j: float | None  # total, over the replies whose energy was read
    j_per_token: float | None  # energy over the tokens of those replies
    tokens_per_j: float | None
    energy_sources: str
    energy_missing: int  # replies without an energy figure
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(key: str, rows: Sequence[Row], detail: str = "") -> Summary:
    measured = [r for r in rows if r.get("energy_j") is not None]
    joules = sum(float(r["energy_j"]) for r in measured) if measured else None
    tokens_measured = sum(int(r["generated_tokens"]) for r in measured)
    per_token = joules / tokens_measured if joules is not None and tokens_measured else None
    sources = sorted({str(r["energy_source"]) for r in measured if r.get("energy_source")})
    return Summary(
        key=key,
        replies=len(rows),
        prompt_tokens=sum(int(r["prompt_tokens"]) for r in rows),
        generated_tokens=sum(int(r["generated_tokens"]) for r in rows),
        decode_tok_s=_median(rows, "decode_tok_s"),
        ttft_ms=_median(rows, "ttft_ms"),
        itl_p50_ms=_median(rows, "itl_p50_ms"),
        itl_p99_ms=_median(rows, "itl_p99_ms"),
        peak_memory=max((_peak(r) for r in rows), default=0),
        energy_j=joules,
        j_per_token=per_token,
        tokens_per_j=1 / per_token if per_token else None,
        energy_sources=", ".join(sources),
        energy_missing=len(rows) - len(measured),
        detail=detail,
    )


def plan_description(row: Row) -> str:
    return (
        f"ngl {row['n_gpu_layers']}, ctx {row['n_ctx']}, kv {row['type_k']}/{row['type_v']}, "
        f"fa {row['flash_attn']}, {row['threads']} threads, spec {row['spec_mode']}"
    )


def group(rows: Sequence[Row], by: Callable[[Row], str]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(by(r), []).append(r)
    return groups


def report(rows: Sequence[Row]) -> dict[str, list[Summary]]:
    """Summaries per model, per plan and per day (oldest day first)."""
    by_plan = group(rows, lambda r: str(r["plan_key"]))
    return {
        "models": [
            summarize(k, v, _hash_note(v)) for k, v in sorted(group(rows, _model_name).items())
        ],
        "plans": [summarize(k, v, plan_description(v[0])) for k, v in sorted(by_plan.items())],
        "days": [summarize(k, v) for k, v in sorted(group(rows, lambda r: r["day"]).items())],
    }


def _hash_note(rows: Sequence[Row]) -> str:
    hashes = sorted({str(r["model_sha256"]) for r in rows if r.get("model_sha256")})
    return ", ".join(f"sha256 {h}" for h in hashes)


def _model_name(row: Row) -> str:
    return str(row["model"])


_SINCE = re.compile(r"^(\d+)\s*([mhdw])$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, *, now: float | None = None) -> float:
    """--since: a date (2026-05-01), a date and time (2026-05-01T14:00), or an age (7d, 12h,
    30m, 2w). Returns epoch seconds."""
    now = time.time() if now is None else now
    text = text.strip()
    match = _SINCE.match(text)
    if match:
        return now - int(match.group(1)) * _UNIT_S[match.group(2)]
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M"):
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    raise UsageError(
        f"--since {text!r} is neither a date (2026-05-01, 2026-05-01T14:00) "
        "nor an age (30m, 12h, 7d, 2w)"
    )


def select(rows: Sequence[Row], name: str) -> tuple[str, list[Row]]:
    """The rows of a baseline label or a plan id (or a unique prefix of one), and what it is."""
    labelled = [r for r in rows if r.get("label") == name]
    if labelled:
        return f"baseline {name}", labelled
    keys = sorted({str(r["plan_key"]) for r in rows if str(r["plan_key"]).startswith(name)})
    if len(keys) == 1:
        chosen = [r for r in rows if r["plan_key"] == keys[0]]
        return f"plan {keys[0]} ({plan_description(chosen[0])})", chosen
    labels = sorted({str(r["label"]) for r in rows if r.get("label")})
    plans = sorted({str(r["plan_key"]) for r in rows})
    if len(keys) > 1:
        raise UsageError(f"{name!r} matches plans {', '.join(keys)}: give more of the id")
    raise UsageError(
        f"no baseline or plan called {name!r} in the ledger; baselines: "
        f"{', '.join(labels) or 'none (record one with localfab bench)'}; "
        f"plans: {', '.join(plans) or 'none'}"
    )


# The four baseline numbers as compared: (field, label, higher is better).
FOUR: tuple[tuple[str, str, bool], ...] = (
    ("decode_tok_s", "decode tok/s", True),
    ("itl_p50_ms", "latency p50 (ms/token)", False),
    ("itl_p99_ms", "latency p99 (ms/token)", False),
    ("peak_memory", "peak memory", False),
    ("j_per_token", "energy (J/token)", False),
    ("tokens_per_j", "tokens per joule", True),
)


def compare(a: Summary, b: Summary) -> list[dict[str, Any]]:
    """The change from A to B in each baseline number: absolute, relative, better or worse."""
    lines = []
    for key, label, higher_better in FOUR:
        va, vb = getattr(a, key), getattr(b, key)
        change = pct = None
        verdict = "n/a"
        if va is not None and vb is not None:
            change = vb - va
            pct = change / va * 100 if va else None
            if change == 0:
                verdict = "same"
            else:
                verdict = "better" if (change > 0) == higher_better else "worse"
        lines.append(
            {"number": key, "label": label, "a": va, "b": vb, "change": change, "percent": pct}
            | {"verdict": verdict}
        )
    return lines


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render_compare(name_a: str, name_b: str, a: Summary, b: Summary) -> str:
    out = [f"A: {name_a} ({a.replies} replies)", f"B: {name_b} ({b.replies} replies)", ""]
    table = [("", "A", "B", "change")]
    for line in compare(a, b):
        if line["number"] == "peak_memory":
            cells = (format_bytes(line["a"]), format_bytes(line["b"]))
            diff = "-" if line["change"] is None else format_bytes(abs(line["change"]))
            if line["change"] and line["change"] < 0:
                diff = "-" + diff
        else:
            digits = 3 if line["number"] in ("j_per_token", "tokens_per_j") else 1
            cells = (fmt(line["a"], digits), fmt(line["b"], digits))
            diff = "-" if line["change"] is None else f"{line['change']:+.{digits}f}"
        pct = "" if line["percent"] is None else f" ({line['percent']:+.1f}%)"
        verdict = "" if line["verdict"] in ("n/a", "same") else f" {line['verdict']}"
        table.append((line["label"], *cells, diff + pct + verdict))
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for r in table:
        out.append(
            f"  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}".rstrip()
        )
    return "\n".join(out)


def render_summaries(title: str, summaries: Sequence[Summary]) -> list[str]:
    header = (title, "replies", "tokens", "tok/s", "TTFT ms", "p50 ms", "p99 ms", "peak mem")
    table = [header + ("energy J", "tok/J")]
    for s in summaries:
        table.append(
            (
                s.key,
                str(s.replies),
                str(s.generated_tokens),
                fmt(s.decode_tok_s),
                fmt(s.ttft_ms, 0),
                fmt(s.itl_p50_ms),
                fmt(s.itl_p99_ms),
                format_bytes(s.peak_memory) if s.peak_memory else "-",
                fmt(s.energy_j),
                fmt(s.tokens_per_j, 2),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header) + 2)]
    lines = []
    for r in table:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  " + "  ".join(cells))
    details = [f"    {s.key}: {s.detail}" for s in summaries if s.detail]
    return lines + details


def render_report(summaries: Mapping[str, Sequence[Summary]]) -> str:
    parts: list[str] = []
    for section, title in (("models", "model"), ("plans", "plan"), ("days", "day")):
        parts += [f"By {title}", *render_summaries(title, summaries[section]), ""]
    return "\n".join(parts).rstrip()


def energy_reasons(rows: Sequence[Row]) -> list[tuple[str, int]]:
    """Why energy figures are missing, with how many replies each reason covers."""
    counts: dict[str, int] = {}
    for r in rows:
        if r.get("energy_j") is None:
            why = str(r.get("energy_note") or "not measured")
            counts[why] = counts.get(why, 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])
