"""Tools a person chose to always allow: kept in `mcp-approvals.json` in the config folder,
by server, tool and a hash of the tool's definition (a server that changes what its tool says
it does is asked about again), and revocable (`localfab mcp revoke`)."""

from __future__ import annotations

import json
from pathlib import Path

from localfab.mcp.servers import ToolInfo

FILE_NAME = "mcp-approvals.json"


class Approvals:
    """The always-allowed tools, read from and written to `path` at once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, str]:
        """server__tool -> the definition digest allowed (a damaged file allows nothing)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        allowed = data.get("always_allow") if isinstance(data, dict) else None
        if not isinstance(allowed, dict):
            return {}
        return {str(k): str(v) for k, v in allowed.items() if isinstance(v, str)}

    def _write(self, allowed: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"always_allow": allowed}, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.path)

    def allows(self, tool: ToolInfo) -> bool:
        return self._read().get(tool.qualified) == tool.digest

    def allow(self, tool: ToolInfo) -> None:
        allowed = self._read()
        allowed[tool.qualified] = tool.digest
        self._write(allowed)

    def entries(self) -> list[str]:
        """The always-allowed tools' names (`server__tool`), sorted."""
        return sorted(self._read())

    def revoke(self, name: str) -> list[str]:
        """Forget `server__tool`, or every tool of `server`; returns the names forgotten."""
        allowed = self._read()
        gone = [k for k in allowed if k == name or k.startswith(f"{name}__")]
        for key in gone:
            del allowed[key]
        if gone:
            self._write(allowed)
        return sorted(gone)
