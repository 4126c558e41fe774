"""Server benchmark: TTFT and decode tok/s over streaming /v1/completions, side by side.

Sends the same kind of request to each server in turn (alternating, so drift on a shared machine
hits all of them alike), each with a unique prompt so no server answers from its prompt cache,
and reports medians. TTFT is the wall time from sending the request to the first streamed token;
decode tok/s is (tokens - 1) / (time of last token - time of first token), measured by the client
so every server is judged the same way. `ignore_eos` makes every reply the same length.

Usage: python scripts/bench_server.py --url localfab=http://127.0.0.1:8080 \
           --url llama-server=http://127.0.0.1:8081 [--runs 8] [--tokens 64] [--prompt-words 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from dataclasses import dataclass

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


def measure(client: httpx.Client, url: str, prompt: str, n_tokens: int) -> Sample:
    body = {
        "prompt": prompt,
        "max_tokens": n_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    t0 = time.perf_counter()
    stamps: list[float] = []
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and choices[0].get("finish_reason") is None:
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError(f"{url} streamed no tokens")
    span = stamps[-1] - stamps[0]
    decode = (len(stamps) - 1) / span if span > 0 and len(stamps) > 1 else 0.0
    return Sample((stamps[0] - t0) * 1e3, decode, len(stamps))


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
    args = parser.parse_args(argv)
    if args.runs < 6:
        parser.error("--runs must be at least 6 for a meaningful median")
    servers = []
    for item in args.url:
        name, sep, url = item.partition("=")
        if not sep:
            name, url = url or name, name
        servers.append((name, url.rstrip("/")))

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
