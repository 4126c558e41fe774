"""`localfab bench MODEL`: a labelled baseline of the four numbers at a few context depths.

The four numbers are decode speed (tok/s), token-to-token latency (p50 and p99), peak memory and
energy per token where this machine reads power. Each measured reply is a ledger row carrying the
label, so `localfab stats --compare A B` and `localfab bench --compare LABEL` can set two
baselines side by side.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localfab.commands.run import KV_CHOICES
from localfab.errors import UsageError

if TYPE_CHECKING:
    from localfab.ledger.writer import Row
    from localfab.machine.energy import EnergyMeter
    from localfab.runtime import LoadedModel, ModelChoice

# A fixed prompt set, so two baselines measure the same work. Each prompt is preceded by filler
# text up to the context depth being measured.
PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that reverses a linked list.",
    "List three ways to save energy when running software on a laptop.",
)
FILLER = (
    "The quick brown fox jumps over the lazy dog while the river runs past the old mill, "
    "and the miller counts sacks of flour in the evening light. "
)
DEFAULT_DEPTHS = "0,512,2048"
BAR_WIDTH = 40


@dataclass(frozen=True)
class DepthResult:
    """The four numbers at one context depth (medians over the prompt set)."""

    depth: int
    replies: int
    decode_tok_s: float | None
    ttft_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    peak_memory: int
    j_per_token: float | None
    tokens_per_j: float | None


def parse_depths(text: str) -> list[int]:
    try:
        depths = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as exc:
        raise UsageError(f"--depths {text!r}: give token counts separated by commas") from exc
    if not depths or depths[0] < 0:
        raise UsageError(f"--depths {text!r}: give token counts of 0 or more, e.g. 0,512,2048")
    return depths


def prompt_at_depth(loaded: LoadedModel, prompt: str, depth: int) -> list[int]:
    """`prompt` preceded by filler so that the whole is about `depth` tokens (at least the
    prompt itself)."""
    tail = loaded.engine.tokenize(prompt, add_special=False, parse_special=False)
    head = [loaded.engine.bos_token] if loaded.engine.add_bos else []
    need = depth - len(tail) - len(head)
    filler: list[int] = []
    if need > 0:
        unit = loaded.engine.tokenize(FILLER, add_special=False, parse_special=False)
        filler = (unit * (need // len(unit) + 1))[:need]
    return head + filler + tail


def measure(
    loaded: LoadedModel,
    *,
    model: str,
    plan: Any,
    label: str,
    depths: Sequence[int],
    n_prompts: int,
    n_gen: int,
    meter: EnergyMeter,
) -> list[Row]:
    """One greedy reply of `n_gen` tokens per prompt and depth, each from an empty KV cache."""
    from localfab.engine import Done, SamplingParams
    from localfab.ledger.writer import TokenClock, build_row

    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    rows: list[Row] = []
    engine = loaded.engine
    for depth in depths:
        for prompt in PROMPTS[:n_prompts]:
            tokens = prompt_at_depth(loaded, prompt, depth)
            engine.clear_cache()
            clock = TokenClock()
            tick, now = clock.tick, time.perf_counter
            done = None
            with meter.measure() as measured:
                for event in engine.stream(tokens, max_tokens=n_gen, sampling=sampling):
                    if isinstance(event, Done):
                        done = event
                    else:
                        tick(now())
            assert done is not None
            rows.append(
                build_row(
                    frontend="bench",
                    model=model,
                    plan=plan,
                    timings=done.timings,
                    prompt_tokens=len(tokens),
                    generated_tokens=done.completion_tokens,
                    clock=clock,
                    energy=measured.energy,
                    model_path=loaded.path,
                    label=label,
                    depth=depth,
                )
            )
    return rows


def by_depth(rows: Sequence[dict[str, Any]]) -> list[DepthResult]:
    from localfab.ledger import report as lr

    results = []
    for depth, group in sorted(lr.group(rows, lambda r: str(r["depth"])).items(), key=_num):
        s = lr.summarize(depth, group)
        results.append(
            DepthResult(
                depth=int(depth),
                replies=s.replies,
                decode_tok_s=s.decode_tok_s,
                ttft_ms=s.ttft_ms,
                itl_p50_ms=s.itl_p50_ms,
                itl_p99_ms=s.itl_p99_ms,
                peak_memory=s.peak_memory,
                j_per_token=s.j_per_token,
                tokens_per_j=s.tokens_per_j,
            )
        )
    return results


def _num(item: tuple[str, Any]) -> int:
    return int(item[0])


def chart(results: Sequence[DepthResult], before: Sequence[DepthResult] = ()) -> str:
    """tok/s against context depth as bars (with an earlier baseline's bars under them), and
    energy per token where power was read."""
    earlier = {r.depth: r for r in before}
    top = max(
        [r.decode_tok_s or 0.0 for r in (*results, *before)] + [1e-9],
    )
    width = max(len(str(r.depth)) for r in results)
    lines = [f"decode tok/s by context depth (tokens){'  [A: earlier, B: now]' if before else ''}"]
    for r in results:
        old = earlier.get(r.depth)
        if old is not None:
            lines.append(_bar(f"{'':>{width}} A", old.decode_tok_s, top, None))
        tag = f"{r.depth:>{width}}" + (" B" if before else "")
        lines.append(_bar(tag, r.decode_tok_s, top, r.j_per_token))
    return "\n".join(lines)


def _bar(tag: str, value: float | None, top: float, j_per_token: float | None) -> str:
    if value is None:
        return f"{tag} │ (no decode figure)"
    eighths = round(value / top * BAR_WIDTH * 8)
    bar = "█" * (eighths // 8) + ("▏▎▍▌▋▊▉"[eighths % 8 - 1] if eighths % 8 else "")
    energy = f"  {j_per_token:.3f} J/token" if j_per_token is not None else ""
    return f"{tag} │{bar:<{BAR_WIDTH}} {value:6.1f} tok/s{energy}"


def render_table(results: Sequence[DepthResult]) -> str:
    from localfab.ledger.report import fmt
    from localfab.units import format_bytes

    header = ("depth", "tok/s", "TTFT ms", "p50 ms", "p99 ms", "peak mem", "J/token", "tok/J")
    table = [header] + [
        (
            str(r.depth),
            fmt(r.decode_tok_s),
            fmt(r.ttft_ms, 0),
            fmt(r.itl_p50_ms),
            fmt(r.itl_p99_ms),
            format_bytes(r.peak_memory),
            fmt(r.j_per_token, 3),
            fmt(r.tokens_per_j, 2),
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table
    )


@click.command("bench")
@click.argument("model")
@click.option("--label", default=None, help="Name of this baseline (default: model and time).")
@click.option(
    "--depths",
    default=DEFAULT_DEPTHS,
    show_default=True,
    help="Context depths in tokens, separated by commas.",
)
@click.option("-n", "--n-gen", type=int, default=64, show_default=True, help="Tokens per reply.")
@click.option(
    "--prompts",
    "n_prompts",
    type=click.IntRange(1, len(PROMPTS)),
    default=len(PROMPTS),
    show_default=True,
    help="How many prompts of the fixed set to run at each depth.",
)
@click.option("--compare", "compare_to", default=None, help="An earlier baseline's label.")
@click.option("-c", "--ctx-size", type=int, default=None, help="Context window in tokens.")
@click.option("-ngl", "--n-gpu-layers", type=int, default=None, help="Layers to put on the GPU.")
@click.option("-ctk", "--cache-type-k", type=KV_CHOICES, default=None, help="KV cache type for K.")
@click.option("-ctv", "--cache-type-v", type=KV_CHOICES, default=None, help="KV cache type for V.")
@click.option("-fa", "--flash-attn", type=click.Choice(["auto", "on", "off"]), default=None)
@click.option("-t", "--threads", type=int, default=None, help="CPU threads.")
@click.option("--json", "as_json", is_flag=True, help="Print the baseline as JSON.")
def bench(
    model: str,
    label: str | None,
    depths: str,
    n_gen: int,
    n_prompts: int,
    compare_to: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Record a labelled baseline of MODEL; chart tok/s by depth.

    The baseline is the four numbers (decode tok/s, latency per token p50/p99, peak memory,
    energy per token where power is read) at each depth, with a fixed prompt set; its rows go
    in the usage ledger, so `localfab stats --compare A B` can set two baselines side by side.
    """
    from localfab.commands.run import setup_logging
    from localfab.config import Config, default_paths
    from localfab.ledger.writer import Ledger, ledger_path, rows_to_dicts
    from localfab.runtime import choose_model, wishes_from_options

    setup_logging(False)
    if n_gen < 2:
        raise UsageError(f"--n-gen must be at least 2 (a latency needs two tokens), not {n_gen}")
    wanted = parse_depths(depths)
    paths = default_paths()
    ledger = Ledger(ledger_path(paths.data_dir))
    earlier = rows_to_dicts(ledger.rows())
    label = label or f"{Path(model).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if any(r["label"] == label for r in earlier):
        raise UsageError(
            f"a baseline called {label!r} exists already: pick another --label, "
            f"or compare with it (--compare {label})"
        )
    before = [r for r in earlier if compare_to and r["label"] == compare_to]
    if compare_to and not before:
        known = sorted({r["label"] for r in earlier if r["label"]})
        raise UsageError(
            f"no baseline called {compare_to!r}; known: {', '.join(known) or 'none yet'}"
        )
    choice = choose_model(model, paths, wishes_from_options(Config.load(paths), **options))
    chosen = choice.plan
    too_deep = [d for d in wanted if d + n_gen >= chosen.n_ctx]
    if too_deep:
        raise UsageError(
            f"depth {too_deep[0]} plus {n_gen} tokens does not fit the {chosen.n_ctx}-token "
            "context: lower --depths or raise -c"
        )
    rows = _run(choice, model, label, wanted, n_prompts, n_gen)
    saved = sum(ledger.record(row) for row in rows)
    ledger.fill_hashes()
    results = by_depth(rows_to_dicts(row.columns() for row in rows))
    old = by_depth(before)
    _print(label, chosen, results, old, before, rows, saved, ledger, as_json=as_json)


def _run(
    choice: ModelChoice,
    model: str,
    label: str,
    depths: Sequence[int],
    n_prompts: int,
    n_gen: int,
) -> list[Row]:
    from localfab.machine.energy import EnergyMeter

    loaded = choice.open()
    try:
        return measure(
            loaded,
            model=model,
            plan=choice.plan,
            label=label,
            depths=depths,
            n_prompts=n_prompts,
            n_gen=n_gen,
            meter=EnergyMeter.for_this_machine(),
        )
    finally:
        loaded.close()


def _print(
    label: str,
    chosen: Any,
    results: list[DepthResult],
    old: list[DepthResult],
    before: list[dict[str, Any]],
    rows: list[Row],
    saved: int,
    ledger: Any,
    *,
    as_json: bool,
) -> None:
    from dataclasses import asdict

    from localfab.ledger import report as lr
    from localfab.ledger.writer import PlanInfo, rows_to_dicts

    plan = PlanInfo.of(chosen)
    now_rows = rows_to_dicts(row.columns() for row in rows)
    comparison = None
    if before:
        a = lr.summarize(str(before[0]["label"]), before)
        b = lr.summarize(label, now_rows)
        comparison = (a, b)
    notes = lr.energy_reasons(now_rows)
    if as_json:
        data: dict[str, Any] = {
            "label": label,
            "plan": asdict(plan) | {"key": plan.key},
            "saved": saved,
            "depths": [asdict(r) for r in results],
            "energy_missing": [{"reason": r, "replies": n} for r, n in notes],
        }
        if comparison:
            data["compare"] = {
                "label": comparison[0].key,
                "depths": [asdict(r) for r in old],
                "changes": lr.compare(*comparison),
            }
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"Baseline {label}: plan {plan.key} ({plan.describe()})")
    click.echo(render_table(results))
    click.echo("")
    click.echo(chart(results, old))
    for reason, n in notes:
        click.echo(f"\nEnergy not measured ({n} replies): {reason}")
    if comparison:
        a, b = comparison
        click.echo("")
        click.echo(lr.render_compare(f"baseline {a.key}", f"baseline {b.key}", a, b))
    if saved < len(rows):
        click.echo(
            f"\n! {len(rows) - saved} of {len(rows)} rows were not saved: {ledger.last_error}",
            err=True,
        )
