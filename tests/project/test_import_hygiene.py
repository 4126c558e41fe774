"""The layer seams: only the engine imports llama_cpp, only localfab/tui imports textual (and
textual-image, Pillow), only localfab/server imports the web framework, only localfab/mcp
imports the MCP SDK."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "localfab"
RULES = {
    "llama_cpp": "engine",
    "textual": "tui",
    "textual_image": "tui",
    "PIL": "tui",  # pictures of images in the app; the rest reads image headers itself
    "starlette": "server",
    "uvicorn": "server",
    "mcp": "mcp",
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
        "localfab.gguf.facts, localfab.machine.probes, localfab.config, localfab.engine, "
        "localfab.runtime\n"
        "print(sorted(m for m in ('textual', 'textual_image', 'PIL', 'starlette', 'uvicorn', "
        "'llama_cpp') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# Layers below the engine: they take what they need from it as arguments (the front end passes
# the engine's `backend_info` to the hardware probe) and never import it.
BELOW_ENGINE = (
    "machine/probes.py",
    "machine/types.py",
    "machine/gpus.py",
    "gguf/facts.py",
    "gguf/header.py",
    "gguf/hparams.py",
    "config.py",
    "errors.py",
    "plan",
)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside a function, fully named."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_layers_below_the_engine_never_import_it():
    offenders = []
    for name in BELOW_ENGINE:
        target = PACKAGE / name
        for path in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            engine = {m for m in imports_of(path) if m.startswith("localfab.engine")}
            offenders += [f"{path.relative_to(PACKAGE.parent)} imports {m}" for m in engine]
    assert offenders == []


def test_probing_the_machine_does_not_import_the_engine(tmp_path: Path):
    code = (
        "import sys\n"
        "from types import SimpleNamespace\n"
        "import localfab.machine.probes as hw\n"
        "psutil_like = SimpleNamespace(cpu_count=lambda logical=True: 4,\n"
        "    virtual_memory=lambda: SimpleNamespace(total=8 << 30, available=4 << 30))\n"
        f"machine = hw.probe_machine(run=lambda argv: None, sysfs_root={str(tmp_path)!r},\n"
        "    psutil_module=psutil_like)\n"
        "assert machine.backend.backends == ('CPU',), machine.backend\n"
        "print(sorted(m for m in sys.modules if m.startswith(('localfab.engine', 'llama_cpp'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
