"""The prompt cache's disk tier: reopening a long chat after a restart, and what a state costs.

reopen: a stored chat of about N tokens (4,000 and 8,000 by default) is opened in a new process
        by the app's backend (`LocalBackend`: the planner, the loader, `ChatSession.resume`),
        and a short question is asked. "restored" runs find the chat's KV state in the cache
        folder, left there by an earlier process that quit with the chat open; "processed" runs
        have the disk tier off (prompt_cache = false) and process the window. Each run is its
        own process (a restart: nothing in RAM), alternating the two, on a fresh copy of the
        history and of the cache folder, so every run sees the same chat. The figure is open +
        TTFT (from opening the chat to the reply's first text), median over runs; goal
        restored/processed <= 0.1.
        Also measured once per size: the state file's bytes and the time to write it, per 1,000
        tokens (the write the app makes when a chat goes idle, is switched away from or quits).

Usage: python scripts/bench.py cache [--model PATH|NAME] [--tokens 4000 8000] [--runs 3]
                                     [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CTX = 16384
VOCABULARY = (
    "lighthouse harbour tide keeper lantern fog signal rock coast storm beacon ship compass "
    "chart reef wave gull rope anchor sail evening night morning lamp oil"
)
WORDS = VOCABULARY.split(" ")


sys.path.insert(0, str(ROOT / "scripts"))


def _model(name: str | None) -> Path:
    from bench_ledger import _model as model_of

    return model_of(name)


def _chat(home: Path, model: Path, n_tokens: int) -> int:
    """A stored chat whose window is about `n_tokens` tokens of the model; its id."""
    import random

    from localfab.chat.history import History
    from localfab.config import default_paths
    from localfab.engine import Engine, EngineSettings

    rng = random.Random(n_tokens)
    history = History(default_paths({"LOCALFAB_HOME": str(home)}).sessions_db)
    sid = history.create_session(model=model.name)
    with Engine(model, EngineSettings(n_ctx=512, warmup=False)) as engine:
        total, i = 0, 0
        while total < n_tokens:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 160))) + "."
            total += len(engine.tokenize(text, add_special=False)) + 6
            history.add_message(sid, "user" if i % 2 == 0 else "assistant", text)
            i += 1
    history.close()
    return sid


def child(args: argparse.Namespace) -> None:
    """One app start: open the chat, ask, report open + TTFT as JSON; quit (persisting)."""
    from localfab.chat.history import History
    from localfab.config import Config, default_paths
    from localfab.engine.types import SamplingParams
    from localfab.tui.backend import ReplyFinished, ReplyText
    from localfab.tui.local_backend import ChatOptions, LocalBackend, model_loader

    paths = default_paths()
    config = Config(prompt_cache=args.mode != "processed", threads=args.threads or 0)
    options = ChatOptions(max_tokens=4, max_continues=0, sampling=SamplingParams.greedy())
    loader = model_loader(str(args.model), paths, config, ctx_size=CTX)
    backend = LocalBackend(loader, History(paths.sessions_db), args.model.name, options)
    backend.load(progress=lambda _: None, cancel=threading.Event())
    t0 = time.perf_counter()
    backend.open_session(session_id=args.session, system=None)
    opened = time.perf_counter() - t0
    first, note = 0.0, ""
    for event in backend.send("What did the keeper see?", cancel=threading.Event()):
        if isinstance(event, ReplyText) and not first:
            first = time.perf_counter() - t0
        if isinstance(event, ReplyFinished):
            note = event.prompt_note
    used = backend.context_usage()[0]
    backend.close()  # quitting writes the chat's state (the first start leaves it for the rest)
    print(json.dumps({"open_s": opened, "ttft_s": first or opened, "note": note, "tokens": used}))


def write_cost(model: Path, n_tokens: int, threads: int | None) -> dict[str, float]:
    """Bytes and seconds to write a state of `n_tokens` tokens, per 1,000 tokens."""
    from localfab.engine import Engine, EngineSettings
    from localfab.engine.prompt_cache import open_prompt_cache

    folder = Path(tempfile.mkdtemp(prefix="lf-cache-cost-"))
    try:
        with Engine(model, EngineSettings(n_ctx=CTX, n_threads=threads or 0)) as engine:
            engine.use_prompt_cache(
                open_prompt_cache(0, key=engine.state_key(), folder=folder, disk_limit=8 << 30)
            )
            text = " ".join(WORDS * (n_tokens // len(WORDS) + 1))
            engine.evaluate(engine.tokenize(text)[:n_tokens])
            t0 = time.perf_counter()
            written = engine.persist_prompt()
            seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    k = n_tokens / 1000
    return {"mb_per_1k": written / 1e6 / k, "write_ms_per_1k": seconds * 1e3 / k}


def _start(model: Path, home: Path, session: int, mode: str, threads: int | None) -> dict[str, Any]:
    env = dict(os.environ, LOCALFAB_HOME=str(home))
    cmd = [sys.executable, __file__, "--child", mode, "--session", str(session)]
    cmd += ["--model", str(model)] + (["--threads", str(threads)] if threads else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"bench child failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def reopen(model: Path, n_tokens: int, runs: int, threads: int | None) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="lf-reopen-"))
    try:
        seed = base / "seed"
        session = _chat(seed, model, n_tokens)
        pristine = base / "pristine.sqlite3"
        db = seed / "data" / "sessions.sqlite3"
        shutil.copy(db, pristine)
        _start(model, seed, session, "first", threads)  # leaves the chat's state on disk
        shutil.copy(pristine, db)  # the chat as it was: the question it asked is gone
        times: dict[str, list[float]] = {"restored": [], "processed": []}
        notes: dict[str, str] = {}
        tokens = 0
        for r in range(runs):
            order = ["restored", "processed"] if r % 2 == 0 else ["processed", "restored"]
            for mode in order:
                home = base / f"{mode}-{r}"
                shutil.copytree(seed, home)
                got = _start(model, home, session, mode, threads)
                times[mode].append(got["ttft_s"])
                notes[mode] = got["note"]
                tokens = got["tokens"]
                shutil.rmtree(home, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    restored = statistics.median(times["restored"])
    processed = statistics.median(times["processed"])
    return {
        f"reopen_{n_tokens}_window_tokens": tokens,
        f"reopen_{n_tokens}_restored_s": restored,
        f"reopen_{n_tokens}_processed_s": processed,
        f"reopen_{n_tokens}_ratio": restored / processed,
        f"reopen_{n_tokens}_note_restored": notes["restored"],
        f"reopen_{n_tokens}_note_processed": notes["processed"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model")
    parser.add_argument("--tokens", type=int, nargs="+", default=[4000, 8000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--child", choices=["first", "restored", "processed"], help=argparse.SUPPRESS
    )
    parser.add_argument("--session", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.mode = args.child
        args.model = Path(args.model)
        child(args)
        return
    model = _model(args.model)
    report: dict[str, Any] = {"model": str(model)}
    for n in args.tokens:
        report |= reopen(model, n, args.runs, args.threads)
        cost = write_cost(model, n, args.threads)
        report |= {f"state_{n}_{k}": v for k, v in cost.items()}
    from bench import print_report

    print_report(report, as_json=args.json, width=34)


if __name__ == "__main__":
    main()
