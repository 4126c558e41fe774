"""A thinking model's answer from localfab serve and from llama-server, side by side.

Both servers run the same model with the same thinking template (`--chat-template-file`; start
llama-server with `--jinja`) and get the same requests: a grammar forces the reply, so both
generate the same text whatever the model; each reasoning_format, whole and streamed. Prints,
per case, each server's (reasoning_content, content) and whether they are equal.

With --budget the model writes freely (greedy, end-of-generation banned) and each request
carries a reasoning budget (`reasoning_budget_tokens` 0, 8, 32, with and without a
`reasoning_budget_message`): where each server closes the block, and what follows. Run it with
tests/engine/templates/opens-think-plain.jinja: llama-server finds the tag by its tokens, and on
the test model R1's prompt spells `<think>` with other tokens than the tag alone.

Usage: python scripts/compare_reasoning.py --url localfab=http://127.0.0.1:8091 \\
           --url llama-server=http://127.0.0.1:8092 [--template qwen3|r1] [--budget]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from functools import partial
from typing import Any

import httpx

REPLIES = {
    "qwen3": [
        "<think>\\nPlan it step by step.\\n</think>\\n\\nDone.",
        "<think>\\nStill thinking \\n",
        "Done.",
        "<think>  a  b  </think>  c  ",
        "<think>\\n \\nx</think>\\n \\ny",
        "<think>\\n\\n</think>\\n\\nHello",
        "\\n<think>x</think>y",
    ],
    "r1": ["\\nPlan.\\n</think>\\n\\nDone.", "Plan.</think>  Done.", "  Plan.", "</think>Hello"],
}
FORMATS = ("auto", "deepseek", "deepseek-legacy", "none")


def answer(url: str, reply: str, fmt: str, *, stream: bool) -> tuple[str, str]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 80,
        "temperature": 0,
        "grammar": f'root ::= "{reply}"',
        "reasoning_format": fmt,
    }
    return ask(url, body, stream=stream)


BUDGETS = ((0, ""), (8, ""), (32, ""), (8, " Time to answer."))


def budgeted(url: str, budget: int, message: str, fmt: str, *, stream: bool) -> tuple[str, str]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 60,
        "temperature": 0,
        "ignore_eos": True,
        "reasoning_budget_tokens": budget,
        "reasoning_budget_message": message,
        "reasoning_format": fmt,
    }
    return ask(url, body, stream=stream)


def ask(url: str, body: dict[str, Any], *, stream: bool) -> tuple[str, str]:
    """(reasoning_content, content) of a chat answer, whole or streamed."""
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        message = r.json()["choices"][0]["message"]
        return message.get("reasoning_content") or "", message.get("content") or ""
    parts = {"reasoning_content": "", "content": ""}
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    for key in parts:
                        parts[key] += choice["delta"].get(key) or ""
    return parts["reasoning_content"], parts["content"]


def compare(servers: list[list[str]], label: str, ask_one: Any) -> bool:
    """Ask every server the same (`ask_one(url)`), print both answers; whether they agree."""
    got = [ask_one(url) for _, url in servers]
    same = all(g == got[0] for g in got)
    shown = "  ".join(f"{name}={got[i]!r}" for i, (name, _) in enumerate(servers))
    print(f"{'same' if same else 'DIFF'}  {label}\n      {shown}")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", required=True, help="NAME=URL (two)")
    parser.add_argument("--template", choices=sorted(REPLIES), default="qwen3")
    parser.add_argument("--budget", action="store_true", help="compare reasoning budgets")
    args = parser.parse_args()
    servers = [u.split("=", 1) for u in args.url]
    differ = 0
    if args.budget:
        for (budget, msg), fmt, stream in itertools.product(BUDGETS, ("none", "auto"), (0, 1)):
            label = f"budget {budget:2} {msg!r:18} {fmt:5} {'stream' if stream else 'whole'}"
            differ += not compare(
                servers,
                label,
                partial(budgeted, budget=budget, message=msg, fmt=fmt, stream=bool(stream)),
            )
    else:
        for reply, fmt, stream in itertools.product(REPLIES[args.template], FORMATS, (0, 1)):
            label = f"{reply!r:42} {fmt:15} {'stream' if stream else 'whole'}"
            differ += not compare(
                servers, label, partial(answer, reply=reply, fmt=fmt, stream=bool(stream))
            )
    print(f"{differ} case(s) differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
