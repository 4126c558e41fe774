"""`localfab mcp import` and `localfab mcp tools` through the installed console script, with
real files: hostile or careless mcpServers files are told in a line, never taken whole or
with a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.mcp.conftest import ROOT

pytestmark = pytest.mark.slow

LOCALFAB = shutil.which("localfab", path=str(Path(sys.executable).parent)) or "localfab"


def localfab(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOCALFAB_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [LOCALFAB, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )


def config_text(home: Path) -> str:
    found = list(home.rglob("config.toml"))
    return found[0].read_text(encoding="utf-8") if found else ""


def test_import_says_which_variables_go_to_which_host(tmp_path: Path) -> None:
    source = tmp_path / "mcp.json"
    servers = {
        "hub": {
            "url": "https://evil.example/mcp",
            "headers": {"Authorization": "Bearer ${HF_TOKEN}", "X-Other": "${env:OTHER_KEY}"},
        },
        "files": {"command": "npx", "env": {"TOKEN": "${GITHUB_TOKEN:-none}"}},
        "plain": {"command": "uvx", "args": ["plain"]},
    }
    source.write_text(json.dumps({"mcpServers": servers}))
    done = localfab(tmp_path / "home", "mcp", "import", str(source))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "  hub: HF_TOKEN, OTHER_KEY will be sent to evil.example" in lines
    assert "  files: GITHUB_TOKEN will be given to the program npx" in lines
    assert not any(line.startswith("  plain") for line in lines)


def test_nested_brackets_are_one_line(tmp_path: Path) -> None:
    source = tmp_path / "mcp.json"
    source.write_text("[" * 100_000 + "]" * 100_000)
    done = localfab(tmp_path / "home", "mcp", "import", str(source))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "nested too deep" in done.stderr


def test_duplicate_names_are_told_and_nothing_is_imported(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = tmp_path / "first.json"
    first.write_text(json.dumps({"mcpServers": {"files": {"command": "a"}}}))
    assert localfab(home, "mcp", "import", str(first)).returncode == 0
    before = config_text(home)
    source = tmp_path / "mcp.json"
    source.write_text(
        '{"mcpServers": {"git": {"command": "good"}, "git": {"command": "evil"},'
        ' "files": {"command": "b"}, "new": {"command": "c"}}}'
    )
    done = localfab(home, "mcp", "import", str(source))
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    assert any("names MCP server 'git' more than once" in line for line in lines)
    assert any("already has MCP server(s) files" in line for line in lines)
    assert "nothing imported" in lines[-1]
    assert config_text(home) == before


def test_c1_controls_are_escaped_in_config_toml(tmp_path: Path) -> None:
    home = tmp_path / "home"
    source = tmp_path / "mcp.json"
    arg = "x\u009b31m\u0085y\u202ez"  # CSI, NEL and a right-to-left override
    source.write_text(json.dumps({"mcpServers": {"odd": {"command": "run", "args": [arg]}}}))
    done = localfab(home, "mcp", "import", str(source))
    assert done.returncode == 0, done.stderr
    text = config_text(home)
    assert not any("\x80" <= c <= "\x9f" or c == "\u202e" for c in text)
    assert tomllib.loads(text)["mcp"]["servers"]["odd"]["args"] == [arg]


def test_a_huge_file_or_too_many_servers_is_refused_in_a_line(tmp_path: Path) -> None:
    source = tmp_path / "mcp.json"
    many = {f"s{i}": {"command": "x", "args": ["a" * 20_000]} for i in range(200)}
    source.write_text(json.dumps({"mcpServers": many}))  # 4 MB
    started = time.monotonic()
    done = localfab(tmp_path / "home", "mcp", "import", str(source))
    assert done.returncode != 0 and "larger than 1 MiB" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    source.write_text(json.dumps({"mcpServers": {f"s{i}": {"command": "x"} for i in range(300)}}))
    done = localfab(tmp_path / "home", "mcp", "import", str(source))
    assert done.returncode != 0 and "300 MCP servers, more than 256" in done.stderr
    assert time.monotonic() - started < 20
    assert config_text(tmp_path / "home") == ""


def test_a_schema_1000_deep_is_refused_in_a_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    source = tmp_path / "mcp.json"
    server = {"command": sys.executable, "args": ["-m", "tests.mcp.deepserver", "1000"]}
    server["cwd"] = str(ROOT)
    source.write_text(json.dumps({"mcpServers": {"deep": server}}))
    assert localfab(home, "mcp", "import", str(source)).returncode == 0
    started = time.monotonic()
    done = localfab(home, "mcp", "tools", "deep")
    assert time.monotonic() - started < 28  # (a busy machine's figure; it waited 30 s before)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deep: MCP server 'deep' could not start")
    # A schema as deep as a grammar takes (30 objects: 60 levels of JSON) is listed.
    server["args"] = ["-m", "tests.mcp.deepserver", "30"]
    source.write_text(json.dumps({"mcpServers": {"ok": server}}))
    assert localfab(home, "mcp", "import", str(source)).returncode == 0
    listed = localfab(home, "mcp", "tools", "ok")
    assert listed.returncode == 0 and "ok__deep" in listed.stdout, listed.stderr
