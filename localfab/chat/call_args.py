"""Tool calls' arguments for templates that write them as text (Functionary v3.2's
`'\n' + arguments`): llama.cpp gives such a template the arguments as JSON text, where others
get an object (`arguments | tojson`). `ChatTemplate.takes_text_arguments` asks the template
once, with `PROBE_CALL`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

_CALL = {"id": "call00001", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
PROBE_CALL: list[dict[str, Any]] = [
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "", "tool_calls": [_CALL]},
]


def arguments_as_text(msgs: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`msgs` with their tool calls' arguments as JSON text (None: no call has an object)."""
    out, changed = [], False
    for m in msgs:
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            fixed = []
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("arguments"), dict):
                    text = json.dumps(function["arguments"], ensure_ascii=False)
                    call = {**call, "function": {**function, "arguments": text}}
                    changed = True
                fixed.append(call)
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out if changed else None
