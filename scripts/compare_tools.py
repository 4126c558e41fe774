"""Tool calls from localfab serve and from llama-server, side by side.

Both servers run the same model with the same chat template (`--chat-template-file`; llama-server
with `--jinja`) and get the same requests: tools, `tool_choice` required (the grammar makes even a
base model call) or auto, one call or several, whole and streamed. Prints, per case, each server's
(content, tool_calls as name and parsed arguments, finish_reason) and whether they are equal (ids
aside: both make random ones). The few-shot cases show the model earlier turns that call the
tool, so that it calls by itself: both servers then parse the same text, cut at several lengths.
A difference in the text the model was allowed to write (the two grammars are not the same
program) shows as different arguments; the raw replies are printed then (start both servers with
--verbose to get them).

Usage: python scripts/compare_tools.py --url localfab=http://127.0.0.1:8091 \\
           --url llama-server=http://127.0.0.1:8092 [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "enum": ["Istanbul", "Paris"]}},
            "required": ["location"],
        },
    },
}
TEST = {
    "type": "function",
    "function": {
        "name": "test",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {"success": {"type": "boolean", "const": True}},
            "required": ["success"],
        },
    },
}
PYTHON = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Runs code in an ipython interpreter.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"],
        },
    },
}
MESSAGES = [
    {"role": "system", "content": "You are a coding assistant."},
    {
        "role": "user",
        "content": "What is the weather in Istanbul? Then say hello world with python",
    },
]


def _shot(city: str, n: int) -> list[dict[str, Any]]:
    call = {"location": city}
    call_id = f"call{n:05d}"
    return [
        {"role": "user", "content": f"What is the weather in {city}?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(call)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
        {"role": "assistant", "content": f"It is sunny in {city}."},
    ]


# Earlier turns that call the tool: the model, even a base one, calls by itself (tool_choice
# auto, no grammar until it writes the call's opening), so both servers parse the same text.
FEW_SHOT = [
    {"role": "system", "content": "You are a weather assistant."},
    *_shot("Paris", 1),
    *_shot("Rome", 2),
    *_shot("Oslo", 3),
    {"role": "user", "content": "What is the weather in Istanbul?"},
]
# The weather tool with any city (the few-shot model names one of its own).
CITY = {
    "type": "function",
    "function": {
        **WEATHER["function"],
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    },
}
CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "weather, required",
        {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False},
    ),
    ("test, required", {"tools": [TEST], "tool_choice": "required", "parallel_tool_calls": False}),
    (
        "python, required",
        {"tools": [PYTHON], "tool_choice": "required", "parallel_tool_calls": False},
    ),
    (
        "two tools, required",
        {"tools": [WEATHER, TEST], "tool_choice": "required", "parallel_tool_calls": False},
    ),
    ("weather, auto", {"tools": [WEATHER]}),
    ("python, none", {"tools": [PYTHON], "tool_choice": "none"}),
    *(
        (
            f"few-shot, auto, max_tokens {n}{', one call' if not parallel else ''}",
            {
                "messages": FEW_SHOT,
                "tools": [CITY],
                "max_tokens": n,
                "parallel_tool_calls": parallel,
            },
        )
        for n in (4, 9, 14, 24, 40, 80)
        for parallel in (True, False)
    ),
]


def whole(url: str, body: dict[str, Any]) -> tuple[Any, ...]:
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    if r.status_code != 200:
        return ("HTTP", r.status_code, r.json().get("error", {}).get("message", "")[:80])
    choice = r.json()["choices"][0]
    message = choice["message"]
    calls = [
        (c["function"]["name"], _args(c["function"]["arguments"]))
        for c in message.get("tool_calls") or ()
    ]
    raw = (r.json().get("__verbose") or {}).get("content")
    return (message.get("content"), calls, choice["finish_reason"], raw)


def streamed(url: str, body: dict[str, Any]) -> tuple[Any, ...]:
    content, calls, finish = "", [], None
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=300
    ) as r:
        if r.status_code != 200:
            r.read()
            return ("HTTP", r.status_code)
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                delta = choice.get("delta") or {}
                content += delta.get("content") or ""
                for piece in delta.get("tool_calls") or ():
                    if piece["index"] == len(calls):
                        calls.append(["", ""])
                    function = piece.get("function") or {}
                    calls[piece["index"]][0] += function.get("name") or ""
                    calls[piece["index"]][1] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    return (content, [(n, _args(a)) for n, a in calls], finish, None)


def _args(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return ("not JSON", text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", action="append", required=True, help="NAME=URL (two of them)")
    parser.add_argument("--label", default="", help="a name for this run (the template)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--only", default="", help="only the cases whose name has this text")
    args = parser.parse_args()
    servers = dict(u.split("=", 1) for u in args.url)
    differ = 0
    cases = [(name, extra) for name, extra in CASES if args.only in name]
    for name, extra in cases:
        body = {"messages": MESSAGES, "max_tokens": args.max_tokens, "temperature": 0, **extra}
        for mode, ask in (("whole", whole), ("stream", streamed)):
            got = {server: ask(url, body) for server, url in servers.items()}
            same = len({json.dumps(g[:3]) for g in got.values()}) == 1
            differ += not same
            print(f"{args.label} | {name} | {mode} | {'same' if same else 'DIFFER'}")
            for server, g in got.items():
                print(f"    {server}: {json.dumps(g[:3], ensure_ascii=False)[:300]}")
                if not same and len(g) > 3 and g[3] is not None:
                    print(f"    {server} raw: {json.dumps(g[3], ensure_ascii=False)[:300]}")
    print(f"{args.label}: {2 * len(cases) - differ} of {2 * len(cases)} cases the same")
    return 0


if __name__ == "__main__":
    sys.exit(main())
