"""The package's shape, checked: layers and no import circles (import-linter's contracts in
pyproject.toml, `[tool.importlinter]`), private names kept private, modules and functions of a
readable size."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "localfab"
BIN = Path(sys.executable).parent

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def modules() -> list[tuple[str, Path]]:
    """(dotted name, path) of every module of the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def private_imports(tree: ast.AST) -> list[str]:
    """`from localfab.x import _y`, and `m._y` on a module `m` imported from localfab."""
    found = []
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or "localfab" in (node.module or "")):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {node.module} import {alias.name}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("localfab"):
                    imported.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_the_private_name_check_finds_both_forms() -> None:
    tree = ast.parse(
        "from localfab.engine.generation import _make_room, prefill\n"
        "from localfab.engine import generation\n"
        "generation._raw_probs(1)\n"
        "generation.prefill(2)\n"
        "self._own = 1\n"
    )
    assert private_imports(tree) == [
        "from localfab.engine.generation import _make_room",
        "generation._raw_probs",
    ]


def test_no_private_name_is_imported_from_another_module() -> None:
    found = {
        name: private_imports(ast.parse(path.read_text(encoding="utf-8")))
        for name, path in modules()
    }
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_no_module_is_longer_than_a_sitting_s_read() -> None:
    long = {
        name: n
        for name, path in modules()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function from its `def` to its last line: signature, docstring and body."""
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_function_is_longer_than_a_screen() -> None:
    long = {
        f"{name}.{node.name}:{node.lineno}": n
        for name, path in modules()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := function_lines(node)) > MAX_FUNCTION_LINES
    }
    assert long == {}


def test_the_function_length_check_counts_from_def_to_the_end() -> None:
    tree = ast.parse(
        '@decorated\ndef f(\n    a,\n    b,\n):\n    """Doc.\n\n    More."""\n    x = 1\n'
        "    return x\n"
    )
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef) and function_lines(node) == 9


@pytest.mark.slow
def test_the_import_contracts_hold() -> None:
    """Layers (front ends > runtime > hub > store/plan > chat/ledger > engine > gguf/machine >
    base) and no circle between the modules of any package."""
    result = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
