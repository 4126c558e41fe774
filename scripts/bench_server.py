"""Server benchmark: TTFT and decode tok/s over streaming /v1/completions, side by side.

Sends the same kind of request to each server in turn (alternating, so drift on a shared machine
hits all of them alike), each with a unique prompt so no server answers from its prompt cache,
and reports medians. TTFT is the wall time from sending the request to the first streamed token;
decode tok/s is (tokens - 1) / (time of last token - time of first token), measured by the client
so every server is judged the same way. `ignore_eos` makes every reply the same length.

With `--clients 1,2,4,8` it measures parallel slots instead: for each client count C, rounds of
C streams sent at once to each server in turn (start both servers with the same -np and -c),
reporting the aggregate tok/s (all tokens over the round's wall time), the median and p99 TTFT,
and the ratios against the last server. `--long-prompt 2000` adds the chunked-prefill check: three
streams run, a prompt of that many tokens arrives, and the longest gap between two tokens of the
running streams in the seconds around it is reported (the anchor's beside it).

With `--turns 1300,4500` it measures the prompt cache: two chats of about that many words each
take turns on every server (a short question each turn, the history growing as a chat's does),
and the median TTFT of turns 2-6 is reported, per chat and side by side.

Usage: python scripts/bench_server.py --url localfab=http://127.0.0.1:8080 \
           --url llama-server=http://127.0.0.1:8081 [--runs 8] [--tokens 64] [--prompt-words 200]
           [--clients 1,2,4,8] [--long-prompt 2000] [--turns 1300,4500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

WORDS = [
    *("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"),
    *("seven", "bright", "stars", "watch", "silent", "hills", "and", "rivers", "carry"),
    *("old", "stories", "toward", "the", "wide", "grey", "sea"),
]


@dataclass(frozen=True)
class Sample:
    ttft_ms: float
    decode_tok_s: float
    tokens: int


def prompt_for(run: int, n_words: int) -> str:
    """A unique prompt of about n_words words (a fresh prefix defeats every prompt cache)."""
    tag = uuid.uuid4().hex
    body = " ".join(WORDS[(run * 7 + i) % len(WORDS)] for i in range(n_words))
    return f"[{tag}] {body}\nContinue the story:"


@dataclass
class Stream:
    """One streamed reply of a concurrent round: when it was sent and when each token came."""

    t_sent: float = 0.0
    stamps: list[float] = field(default_factory=list)
    error: str = ""


def request_body(prompt: str, n_tokens: int) -> dict[str, Any]:
    """A streamed greedy reply of exactly n_tokens, its prompt evaluated in full."""
    return {
        "prompt": prompt,
        "max_tokens": n_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "cache_prompt": False,
    }


def first_choices(r: httpx.Response) -> Iterator[dict[str, Any]]:
    """The first choice of each streamed /v1/completions chunk, as it comes."""
    for line in r.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choices = json.loads(line[6:]).get("choices") or []
        if choices:
            yield choices[0]


def stream_into(url: str, prompt: str, n_tokens: int, out: Stream) -> None:
    """Stream one /v1/completions reply, stamping every token into `out` (a thread's body)."""
    body = request_body(prompt, n_tokens)
    try:
        with httpx.Client(timeout=600) as client:
            out.t_sent = time.perf_counter()
            with client.stream("POST", url + "/v1/completions", json=body) as r:
                r.raise_for_status()
                for choice in first_choices(r):
                    if choice.get("finish_reason") is None:
                        out.stamps.append(time.perf_counter())
    except (httpx.HTTPError, ValueError) as exc:
        out.error = str(exc)


def concurrent_round(url: str, run: int, clients: int, n_tokens: int, words: int) -> dict[str, Any]:
    """`clients` streams sent at once: aggregate tok/s over the round and each one's TTFT."""
    streams = [Stream() for _ in range(clients)]
    threads = [
        threading.Thread(
            target=stream_into, args=(url, prompt_for(run * 31 + i, words), n_tokens, st)
        )
        for i, st in enumerate(streams)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [st.error for st in streams if st.error or not st.stamps]
    if bad:
        raise RuntimeError(f"{url}: {bad[0] or 'a stream got no tokens'}")
    t_end = max(st.stamps[-1] for st in streams)
    tokens = sum(len(st.stamps) for st in streams)
    return {
        "tok_s": tokens / (t_end - t0),
        "ttft_ms": [(st.stamps[0] - st.t_sent) * 1e3 for st in streams],
    }


def long_prompt_round(url: str, run: int, n_tokens: int, long_words: int) -> float:
    """Three streams run; once each has its first token, a long prompt arrives. The longest
    gap (ms) between two tokens of the running streams from then until the long prompt's
    first token (and a little after)."""
    streams = [Stream() for _ in range(3)]
    threads = [
        threading.Thread(target=stream_into, args=(url, prompt_for(run * 17 + i, 40), n_tokens, st))
        for i, st in enumerate(streams)
    ]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + 120
    while any(not st.stamps for st in streams) and time.perf_counter() < deadline:
        time.sleep(0.005)
    long = Stream()
    lt = threading.Thread(
        target=stream_into, args=(url, prompt_for(run * 17 + 9, long_words), 8, long)
    )
    t_long = time.perf_counter()
    lt.start()
    lt.join()
    for t in threads:
        t.join()
    if long.error or not long.stamps:
        raise RuntimeError(f"{url}: the long prompt failed: {long.error}")
    t_until = long.stamps[0] + 0.2
    worst = 0.0
    for st in streams:
        times = [t for t in st.stamps if t_long <= t <= t_until]
        before = [t for t in st.stamps if t < t_long]
        if before:
            times.insert(0, before[-1])
        after = [t for t in st.stamps if t > t_until]
        if after:
            times.append(after[0])
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        worst = max([worst, *gaps])
    return worst * 1e3


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def concurrent(args: argparse.Namespace, servers: list[tuple[str, str]]) -> None:
    """The parallel-slots comparison (`--clients`, `--long-prompt`)."""
    counts = [int(c) for c in args.clients.split(",")] if args.clients else []
    results: dict[str, Any] = {name: {} for name, _ in servers}
    for clients in counts:
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in servers}
        for run in range(args.warmup + args.runs):
            order = servers[run % len(servers) :] + servers[: run % len(servers)]
            for name, url in order:
                res = concurrent_round(url, run, clients, args.tokens, args.prompt_words)
                if run >= args.warmup:
                    rounds[name].append(res)
        for name, rs in rounds.items():
            ttfts = [t for r in rs for t in r["ttft_ms"]]
            results[name][clients] = {
                "tok_s": statistics.median(r["tok_s"] for r in rs),
                "ttft_median_ms": statistics.median(ttfts),
                "ttft_p99_ms": p99(ttfts),
            }
    if args.long_prompt:
        words = max(args.long_prompt * 3 // 4, 1)  # about that many tokens
        gaps: dict[str, list[float]] = {name: [] for name, _ in servers}
        for run in range(args.warmup + args.runs):
            order = servers[run % len(servers) :] + servers[: run % len(servers)]
            for name, url in order:
                gap = long_prompt_round(url, run, max(args.tokens, 256), words)
                if run >= args.warmup:
                    gaps[name].append(gap)
        for name, gs in gaps.items():
            results[name]["long_prompt_gap_ms"] = statistics.median(gs)
            results[name]["long_prompt_gap_max_ms"] = max(gs)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    base = servers[-1][0]
    print(f"{'server':<14}{'clients':>8}{'agg tok/s':>11}{'TTFT med ms':>13}{'TTFT p99 ms':>13}")
    for clients in counts:
        for name, _ in servers:
            r = results[name][clients]
            print(
                f"{name:<14}{clients:>8}{r['tok_s']:>11.1f}"
                f"{r['ttft_median_ms']:>13.1f}{r['ttft_p99_ms']:>13.1f}"
            )
        for name, _ in servers:
            if name == base:
                continue
            r, b = results[name][clients], results[base][clients]
            print(
                f"  {name} vs {base} at {clients}: tok/s x{r['tok_s'] / b['tok_s']:.2f}, "
                f"TTFT median x{r['ttft_median_ms'] / b['ttft_median_ms']:.2f}, "
                f"p99 x{r['ttft_p99_ms'] / b['ttft_p99_ms']:.2f}"
            )
    if args.long_prompt:
        for name, _ in servers:
            r = results[name]
            print(
                f"{name}: longest gap of 3 running streams while a {args.long_prompt}-token "
                f"prompt arrives: median {r['long_prompt_gap_ms']:.0f} ms, "
                f"max {r['long_prompt_gap_max_ms']:.0f} ms"
            )
        for name, _ in servers:
            if name != base:
                ratio = results[name]["long_prompt_gap_ms"] / results[base]["long_prompt_gap_ms"]
                print(f"  {name} vs {base}: gap x{ratio:.2f}")


def measure(client: httpx.Client, url: str, prompt: str, n_tokens: int) -> Sample:
    body = request_body(prompt, n_tokens)
    t0 = time.perf_counter()
    stamps: list[float] = []
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for choice in first_choices(r):
            if choice.get("finish_reason") is None:
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError(f"{url} streamed no tokens")
    span = stamps[-1] - stamps[0]
    decode = (len(stamps) - 1) / span if span > 0 and len(stamps) > 1 else 0.0
    return Sample((stamps[0] - t0) * 1e3, decode, len(stamps))


QUESTIONS = [
    "What happened next?",
    "Why did that matter?",
    "Who was there?",
    "What changed after that?",
    "How did it end?",
    "What would you do differently?",
]


def chat_turn(client: httpx.Client, url: str, prompt: str, n_tokens: int) -> tuple[float, str]:
    """One turn of a chat (its prompt cached as a client would let it be): TTFT ms and reply."""
    body = {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first = 0.0
    text: list[str] = []
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for choice in first_choices(r):
            if choice.get("text"):
                first = first or time.perf_counter()
                text.append(choice["text"])
    return ((first or time.perf_counter()) - t0) * 1e3, "".join(text)


def turns(args: argparse.Namespace, servers: list[tuple[str, str]]) -> None:
    """Two chats taking turns on each server; median TTFT of turns 2-6 per chat."""
    sizes = [int(n) for n in args.turns.split(",")]
    results: dict[str, dict[str, float]] = {}
    histories = {
        name: [f"[{uuid.uuid4().hex}] " + prompt_for(i, n) for i, n in enumerate(sizes)]
        for name, _ in servers
    }
    ttfts: dict[str, list[list[float]]] = {name: [[] for _ in sizes] for name, _ in servers}
    with httpx.Client(timeout=600) as client:
        for turn in range(len(QUESTIONS)):
            for chat in range(len(sizes)):
                for name, url in servers:
                    history = histories[name][chat] + f"\nUser: {QUESTIONS[turn]}\nAssistant:"
                    ttft, reply = chat_turn(client, url, history, args.tokens)
                    histories[name][chat] = history + reply
                    if turn >= 1:
                        ttfts[name][chat].append(ttft)
    for name, per_chat in ttfts.items():
        results[name] = {
            f"chat{i + 1}_ttft_ms": statistics.median(t) for i, t in enumerate(per_chat)
        }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    base = servers[-1][0]
    for name, r in results.items():
        line = ", ".join(f"{k} {v:.0f}" for k, v in r.items())
        ratios = ", ".join(f"x{r[k] / results[base][k]:.2f}" for k in r) if name != base else ""
        print(f"{name:<16}{line}" + (f"   vs {base}: {ratios}" if ratios else ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", action="append", required=True, help="NAME=URL of a server (repeatable)"
    )
    parser.add_argument("--runs", type=int, default=8, help="measured runs per server (>= 6)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per reply")
    parser.add_argument("--prompt-words", type=int, default=200, help="prompt length in words")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured runs per server")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--clients", help="parallel slots: comma-separated client counts, e.g. 1,2,4,8"
    )
    parser.add_argument(
        "--long-prompt", type=int, default=0, help="tokens of the prompt for the gap check"
    )
    parser.add_argument(
        "--turns", help="prompt cache: words of the two chats' histories, e.g. 1300,4500"
    )
    args = parser.parse_args(argv)
    if args.runs < 6:
        parser.error("--runs must be at least 6 for a meaningful median")
    servers = []
    for item in args.url:
        name, sep, url = item.partition("=")
        if not sep:
            name, url = url or name, name
        servers.append((name, url.rstrip("/")))
    if args.clients or args.long_prompt:
        concurrent(args, servers)
        return
    if args.turns:
        turns(args, servers)
        return

    samples: dict[str, list[Sample]] = {name: [] for name, _ in servers}
    with httpx.Client(timeout=600) as client:
        for run in range(args.warmup + args.runs):
            # Rotate who goes first so neither always follows the other.
            order = servers[run % len(servers) :] + servers[: run % len(servers)]
            for name, url in order:
                prompt = prompt_for(run, args.prompt_words)
                try:
                    sample = measure(client, url, prompt, args.tokens)
                except httpx.RemoteProtocolError as exc:
                    # A keep-alive connection the server had just closed: report, retry once.
                    print(f"note: {name}: {exc}; retrying on a new connection")
                    sample = measure(client, url, prompt_for(run, args.prompt_words), args.tokens)
                if run >= args.warmup:
                    samples[name].append(sample)

    results = {}
    for name, runs in samples.items():
        results[name] = {
            "ttft_ms": statistics.median(s.ttft_ms for s in runs),
            "decode_tok_s": statistics.median(s.decode_tok_s for s in runs),
            "runs": len(runs),
        }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    base_name = servers[-1][0] if len(servers) > 1 else None
    print(f"{'server':<16}{'TTFT ms (median)':>18}{'decode tok/s':>14}{'runs':>6}")
    for name, r in results.items():
        print(f"{name:<16}{r['ttft_ms']:>18.1f}{r['decode_tok_s']:>14.1f}{r['runs']:>6}")
    if base_name is not None:
        base = results[base_name]
        for name, r in results.items():
            if name != base_name:
                print(
                    f"{name} vs {base_name}: TTFT x{r['ttft_ms'] / base['ttft_ms']:.2f}, "
                    f"decode x{r['decode_tok_s'] / base['decode_tok_s']:.2f}"
                )


if __name__ == "__main__":
    main()
