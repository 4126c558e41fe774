"""Benchmarks of localfab against llama.cpp's own tools, side by side in one run.

engine: prompt-processing (pp512) and decode (tg128) tokens/s of the localfab engine and, given
        a llama-bench built from the same llama.cpp version, of llama-bench, alternating rounds,
        with the ratios; and the start-up time of `localfab --help`.

chat:   TTFT of turns 2, 10 and 20 of a conversation with equal-length messages; TTFT of the turn
        that triggers a context shift, of the ordinary turn before it, and of the same shift turn
        when the kept history is re-processed instead (the baseline the shift avoids).

server: TTFT and decode tok/s over streaming /v1/completions against localfab and other servers
        (llama-server), alternating requests with unique prompts (scripts/bench_server.py).

Speed on a shared 2-core machine is noisy, so every figure is compared with its yardstick measured
in the same run (ratios), never against a fixed number.

Usage: python scripts/bench.py engine --model PATH|NAME [--threads 2] [--llama-bench PATH]
                                      [--rounds 3] [--json]
       python scripts/bench.py chat --model PATH|NAME [--threads 2] [--runs 3] [--json]
       python scripts/bench.py server --url localfab=URL [--url llama-server=URL] [--runs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def resolve(model: str) -> Path:
    from localfab.config import default_paths
    from localfab.runtime import resolve_model

    return resolve_model(model, default_paths())


def engine_pp_tg(
    path: Path,
    *,
    threads: int,
    n_prompt: int,
    n_gen: int,
    reps: int,
    flash_attn: str,
    swa_full: bool = False,
) -> dict[str, list[float]]:
    """pp and tg of the localfab engine, the way llama-bench measures them (tokens/s)."""
    from localfab.engine import Engine, EngineSettings, SamplingParams

    settings = EngineSettings(
        n_ctx=max(1024, n_prompt + n_gen + 16),
        n_threads=threads,
        n_batch=2048,
        n_ubatch=512,
        flash_attn=flash_attn,  # type: ignore[arg-type]
        swa_full=swa_full,
    )
    pp: list[float] = []
    tg: list[float] = []
    with Engine(path, settings) as engine:
        vocab = engine.n_vocab
        greedy = SamplingParams(temperature=0.0, ignore_eos=True)
        # Warm-up, as llama-bench does: one short prompt and a few tokens.
        engine.generate([engine.bos_token, 1000, 2000], max_tokens=4, sampling=greedy)
        # Like llama-bench: all prompt runs, then a one-token warm-up, then all generation runs.
        for rep in range(reps):
            # A fresh, unique prompt each time so nothing comes from the cache.
            prompt = [engine.bos_token] + [
                (7919 * (i + 1) + 104729 * rep) % (vocab - 1000) + 500 for i in range(n_prompt - 1)
            ]
            engine.clear_cache()
            done = engine.generate(prompt, max_tokens=1, sampling=greedy)
            pp.append(done.timings.prompt_n / done.timings.prompt_ms * 1e3)
        engine.clear_cache()
        engine.generate([engine.bos_token], max_tokens=2, sampling=greedy)
        for _ in range(reps):
            engine.clear_cache()
            done = engine.generate([engine.bos_token], max_tokens=n_gen + 1, sampling=greedy)
            t = done.timings
            # predicted_ms spans the decode steps after the first sampled token.
            tg.append((t.predicted_n - 1) / t.predicted_ms * 1e3)
    return {"pp": pp, "tg": tg}


def llama_bench(
    binary: Path,
    path: Path,
    *,
    threads: int,
    n_prompt: int,
    n_gen: int,
    reps: int,
    flash_attn: str,
    swa_full: bool = False,
) -> dict[str, list[float]]:
    """llama-bench's own pp/tg samples (tokens/s) for the same model and settings.

    llama-bench has no swa_full option (it always keeps the small sliding-window cache), so it is
    compared with the engine at swa_full off; `--swa-full` measures what localfab's default costs.
    """
    del swa_full
    fa = {"on": "1", "off": "0", "auto": "1"}[flash_attn]
    cmd = [
        str(binary),
        "-m",
        str(path),
        "-t",
        str(threads),
        "-p",
        str(n_prompt),
        "-n",
        str(n_gen),
        "-r",
        str(reps),
        "-fa",
        fa,
        "-b",
        "2048",
        "-ub",
        "512",
        "-o",
        "json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result: dict[str, list[float]] = {"pp": [], "tg": []}
    for row in json.loads(out):
        key = "pp" if row.get("n_prompt", 0) > 0 else "tg"
        samples = row.get("samples_ts") or [row["avg_ts"]]
        result[key].extend(float(x) for x in samples)
    return result


def help_startup(reps: int = 5) -> float:
    """Median wall time of `localfab --help` in ms."""
    exe = shutil.which("localfab", path=str(Path(sys.executable).parent)) or "localfab"
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([exe, "--help"], capture_output=True, check=True)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def cmd_engine(args: argparse.Namespace) -> dict[str, Any]:
    path = resolve(args.model)
    ours: dict[str, list[float]] = {"pp": [], "tg": []}
    theirs: dict[str, list[float]] = {"pp": [], "tg": []}
    kw = dict(
        swa_full=args.swa_full,
        threads=args.threads,
        n_prompt=args.n_prompt,
        n_gen=args.n_gen,
        reps=args.reps,
        flash_attn=args.flash_attn,
    )
    for rnd in range(args.rounds):
        # Alternate which goes first so drift on a noisy machine hits both alike.
        order = ["ours", "theirs"] if rnd % 2 == 0 else ["theirs", "ours"]
        for who in order:
            if who == "ours":
                r = engine_pp_tg(path, **kw)  # type: ignore[arg-type]
                target = ours
            elif args.llama_bench:
                r = llama_bench(Path(args.llama_bench), path, **kw)  # type: ignore[arg-type]
                target = theirs
            else:
                continue
            for k in ("pp", "tg"):
                target[k].extend(r[k])
            print(
                f"round {rnd + 1} {who}: pp {statistics.median(r['pp']):.1f} "
                f"tg {statistics.median(r['tg']):.2f} tok/s",
                file=sys.stderr,
            )
    report: dict[str, Any] = {
        "model": str(path),
        "threads": args.threads,
        "swa_full": args.swa_full,
        f"localfab_pp{args.n_prompt}": statistics.median(ours["pp"]),
        f"localfab_tg{args.n_gen}": statistics.median(ours["tg"]),
        "help_startup_ms": help_startup(),
    }
    if args.llama_bench:
        report[f"llama_bench_pp{args.n_prompt}"] = statistics.median(theirs["pp"])
        report[f"llama_bench_tg{args.n_gen}"] = statistics.median(theirs["tg"])
        report["pp_ratio"] = (
            report[f"localfab_pp{args.n_prompt}"] / report[f"llama_bench_pp{args.n_prompt}"]
        )
        report["tg_ratio"] = (
            report[f"localfab_tg{args.n_gen}"] / report[f"llama_bench_tg{args.n_gen}"]
        )
    return report


class _NoShift:
    """An engine that claims it cannot shift: the session then re-processes the kept turns."""

    can_shift = False

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def _conversation(
    session: Any, turns: int, *, stop_at_shift: bool = False
) -> list[tuple[float, bool, int]]:
    """Run equal-length turns; (TTFT ms, shifted before it?, tokens evaluated) per turn."""
    from localfab.chat.session import Reply, Shifted
    from localfab.engine import SamplingParams

    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    out: list[tuple[float, bool, int]] = []
    for i in range(turns):
        text = f"Turn {i:02d}: tell me one more short fact about lighthouses and the sea."
        shifted = False
        for ev in session.send(text, max_tokens=32, sampling=sampling):
            if isinstance(ev, Shifted) and not ev.during_reply:
                shifted = True
            elif isinstance(ev, Reply):
                out.append((ev.timings.ttft_ms, shifted, ev.timings.prompt_n))
        if stop_at_shift and shifted:
            break
    return out


def cmd_chat(args: argparse.Namespace) -> dict[str, Any]:
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.session import ChatSession
    from localfab.engine import Engine, EngineSettings

    path = resolve(args.model)
    system = "You are a helpful assistant who knows a great deal about lighthouses."
    # TTFT in ms, one per run.
    t2: list[float] = []
    t10: list[float] = []
    t20: list[float] = []
    shift_t: list[float] = []
    ordinary_t: list[float] = []
    reproc_t: list[float] = []
    evaluated: dict[str, list[int]] = {}  # tokens each measured turn evaluated, per run

    def note(name: str, turn: tuple[float, bool, int]) -> float:
        evaluated.setdefault(name, []).append(turn[2])
        return turn[0]

    by_turn: list[list[tuple[float, bool, int]]] = []
    for _ in range(args.runs):
        with Engine(path, EngineSettings(n_ctx=8192, n_threads=args.threads)) as engine:
            session = ChatSession(engine, PromptBuilder(engine), system=system, max_continues=0)
            turns = _conversation(session, 20)
            by_turn.append(turns)
            t2.append(note("turn2", turns[1]))
            t10.append(note("turn10", turns[9]))
            t20.append(note("turn20", turns[19]))
        with Engine(path, EngineSettings(n_ctx=1024, n_threads=args.threads)) as engine:
            for wrapped, sink in ((engine, shift_t), (_NoShift(engine), reproc_t)):
                engine.clear_cache()
                session = ChatSession(
                    wrapped, PromptBuilder(engine), system=system, max_continues=0
                )
                turns = _conversation(session, 60, stop_at_shift=True)
                assert turns[-1][1], "no shift happened"
                sink.append(note("shift" if wrapped is engine else "reprocessed", turns[-1]))
                if wrapped is engine:
                    # The ordinary turn to compare with: the last one before the shift that
                    # evaluated as many tokens (a template that trims replies, say, can make a
                    # turn re-process the previous reply; that is not the shift's cost).
                    alike = [t for t in turns[:-1] if t[2] == turns[-1][2]]
                    ordinary_t.append(note("ordinary", alike[-1] if alike else turns[-2]))
    med = statistics.median
    warnings = [
        f"{a} and {b} evaluated different token counts ({evaluated[a]} vs {evaluated[b]}): "
        "their ratio compares unequal work"
        for a, b in (("turn2", "turn20"), ("ordinary", "shift"))
        if evaluated[a] != evaluated[b]
    ]
    return {
        "model": str(path),
        "threads": args.threads,
        "ttft_turn2_ms": med(t2),
        "ttft_turn10_ms": med(t10),
        "ttft_turn20_ms": med(t20),
        "turn20_over_turn2": med(t20) / med(t2),
        "ttft_ordinary_turn_ms": med(ordinary_t),
        "ttft_shift_turn_ms": med(shift_t),
        "ttft_shift_turn_reprocessed_ms": med(reproc_t),
        "shift_over_ordinary": med(shift_t) / med(ordinary_t),
        "reprocessed_over_ordinary": med(reproc_t) / med(ordinary_t),
        # Tokens each measured turn evaluated (prompt_n), one per run: equal counts mean the
        # turns did equal work apart from attending to a longer history.
        **{f"prompt_n_{name}": counts for name, counts in evaluated.items()},
        # Every turn of the 20-turn conversation (medians over runs), to compare like with like.
        "ttft_by_turn_ms": [round(med(run[i][0] for run in by_turn), 1) for i in range(20)],
        "prompt_n_by_turn": [by_turn[0][i][2] for i in range(20)],
        "warnings": warnings,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_server

        bench_server.main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="part", required=True)
    sub.add_parser("server", help="server TTFT/decode against llama-server (see bench_server.py)")
    eng = sub.add_parser("engine", help="engine pp/tg against llama-bench")
    eng.add_argument("--model", required=True, help="a .gguf path or a registered name")
    eng.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    eng.add_argument("--llama-bench", help="path of llama-bench built from the same llama.cpp")
    eng.add_argument("--n-prompt", type=int, default=512)
    eng.add_argument("--n-gen", type=int, default=128)
    eng.add_argument("--reps", type=int, default=3, help="samples per round")
    eng.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    eng.add_argument("--flash-attn", choices=["on", "off"], default="on")
    eng.add_argument(
        "--swa-full",
        action="store_true",
        help="full-size sliding-window cache, as localfab loads Gemma for chat (default: off, "
        "as llama-bench)",
    )
    eng.add_argument("--json", action="store_true")
    chat = sub.add_parser("chat", help="TTFT across turns and around a context shift")
    chat.add_argument("--model", required=True)
    chat.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    chat.add_argument("--runs", type=int, default=3)
    chat.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = cmd_engine(args) if args.part == "engine" else cmd_chat(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for key, value in report.items():
            print(f"{key:24} {value:.3f}" if isinstance(value, float) else f"{key:24} {value}")


if __name__ == "__main__":
    main()
