"""llama.cpp's own server tests, run against `localfab serve` (scripts/conformance.py): the CI
selection, which fails when a test listed in scripts/conformance_expected.txt stops passing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serverproc import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_expected_list_is_the_ci_selection() -> None:
    names = [
        line
        for line in (ROOT / "scripts/conformance_expected.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert len(names) == len(set(names)) > 100
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from conformance import CI_FILES
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert {n.split("::")[0].removeprefix("unit/") for n in names} <= set(CI_FILES)


def test_llama_cpp_server_tests_still_pass() -> None:
    env = {**os.environ, "PORT": str(free_port())}  # the suite's servers listen there
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/conformance.py"), "--ci", "--check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-6000:] + "\n" + done.stderr[-4000:]
    assert "expected passes hold" in done.stdout
