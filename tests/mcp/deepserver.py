"""An MCP server over stdio, written out by hand (JSON-RPC lines), whose one tool has an input
schema nested DEPTH deep: python -m tests.mcp.deepserver DEPTH.

The SDK's server helpers build a tool's schema from a function's signature; a hostile schema
has to be written as such.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def answer(request: dict[str, Any], depth: int) -> dict[str, Any]:
    method = request.get("method")
    if method == "initialize":
        params = request.get("params") or {}
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "deep", "version": "1"},
        }
    elif method == "tools/list":
        tool = {"name": "deep", "description": "A deep one.", "inputSchema": deep_schema(depth)}
        result = {"tools": [tool]}
    else:
        error = {"code": -32601, "message": f"Method not found: {method}"}
        return {"jsonrpc": "2.0", "id": request["id"], "error": error}
    return {"jsonrpc": "2.0", "id": request["id"], "result": result}


def main() -> None:
    depth = int(sys.argv[1])
    sys.setrecursionlimit(max(1000, depth * 3))
    for line in sys.stdin:
        request = json.loads(line)
        if "id" in request and "method" in request:
            sys.stdout.write(json.dumps(answer(request, depth)) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
