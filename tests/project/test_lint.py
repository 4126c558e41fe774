"""The code checks CI enforces: ruff (lint, format, complexity <= 12) and mypy --strict.

They run as tests so that the README's one test command is also the lint gate; the settings
live in pyproject.toml (`[tool.ruff]`, `[tool.mypy]`), so an editor's ruff and mypy agree.
mypy also checks `tests/typecheck/`: type-level tests (the engines fit `ChatEngine`) that share
its one run instead of starting mypy again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CODE = ["localfab", "tests", "scripts"]

pytestmark = pytest.mark.slow


def check(*args: str) -> None:
    result = subprocess.run(
        [str(BIN / args[0]), *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}"


def test_ruff_lint_and_complexity() -> None:
    check("ruff", "check", *CODE)


def test_ruff_format() -> None:
    check("ruff", "format", "--check", *CODE)


def test_mypy_strict() -> None:
    check("mypy")
