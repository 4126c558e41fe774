"""A thinking model's answer from localfab serve and from llama-server, side by side.

Both servers run the same model with the same thinking template (`--chat-template-file`; start
llama-server with `--jinja`) and get the same requests: a grammar forces the reply, so both
generate the same text whatever the model; each reasoning_format, whole and streamed. Prints,
per case, each server's (reasoning_content, content) and whether they are equal.

Usage: python scripts/compare_reasoning.py --url localfab=http://127.0.0.1:8091 \\
           --url llama-server=http://127.0.0.1:8092 [--template qwen3|r1]
"""

from __future__ import annotations

import argparse
import json
import sys
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", action="append", required=True, help="NAME=URL (two)")
    parser.add_argument("--template", choices=sorted(REPLIES), default="qwen3")
    args = parser.parse_args()
    servers = [u.split("=", 1) for u in args.url]
    differ = 0
    for reply in REPLIES[args.template]:
        for fmt in FORMATS:
            for stream in (False, True):
                got = [answer(url, reply, fmt, stream=stream) for _, url in servers]
                same = all(g == got[0] for g in got)
                differ += not same
                mode = "stream" if stream else "whole"
                shown = "  ".join(f"{name}={got[i]!r}" for i, (name, _) in enumerate(servers))
                print(f"{'same' if same else 'DIFF'}  {reply!r:42} {fmt:15} {mode:6} {shown}")
    print(f"{differ} case(s) differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
