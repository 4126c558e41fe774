"""The layer seams: only the engine imports llama_cpp, only localfab/tui imports textual,
only localfab/server imports the web framework."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "localfab"
RULES = {
    "llama_cpp": "engine",
    "textual": "tui",
    "starlette": "server",
    "uvicorn": "server",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_heavy_libraries_are_imported_only_in_their_layer():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        layer = path.relative_to(PACKAGE).parts[0]
        for module in imported_modules(path) & RULES.keys():
            if layer != RULES[module]:
                offenders.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert offenders == []


def test_core_layers_import_without_the_front_end_libraries():
    code = (
        "import sys\n"
        "import localfab.chat.session, localfab.plan, localfab.hub, localfab.store, "
        "localfab.facts, localfab.hardware, localfab.config, localfab.engine, localfab.runtime\n"
        "print(sorted(m for m in ('textual', 'starlette', 'uvicorn', 'llama_cpp') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
