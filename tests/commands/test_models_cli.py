"""`localfab pull | list | show | rm | add` through the installed console script."""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localfab.units import format_context
from tests.conftest import LOCALFAB
from tests.hf_server import FakeHub
from tests.store.test_store import write_tiny_gguf

REPO = "owner/Tiny-GGUF"
FILE = "Tiny-Q4_K_M.gguf"


def lf(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture()
def fake() -> Iterator[FakeHub]:
    with FakeHub() as hub:
        yield hub


@pytest.fixture()
def env(lf_env: dict[str, str], fake: FakeHub, tmp_path: Path) -> dict[str, str]:
    env = dict(lf_env)
    env.update(
        HF_ENDPOINT=fake.url,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        HF_HOME=str(tmp_path / "hf-home"),
    )
    for var in ("HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(var, None)
    return env


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "outside" / FILE)


def test_help_lists_the_model_commands(env: dict[str, str]) -> None:
    out = lf(env, "--help").stdout
    for command in ("pull", "list", "show", "rm", "add"):
        assert f"  {command} " in out


@pytest.mark.slow  # many runs of the console script, each a new process
def test_add_list_show_rm_a_file_kept_in_place(env: dict[str, str], tiny: Path) -> None:
    added = lf(env, "add", str(tiny), "--name", "tiny:1")
    assert added.returncode == 0, added.stderr
    assert "added tiny:1" in added.stdout and "Q4_K_M" in added.stdout

    listed = lf(env, "list", "--no-fit")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("tiny:1"))
    assert "Q4_K_M" in row and "llama" in row and "never" in row
    assert "gemma3:270m" in listed.stdout  # the built-in test model is always there

    with_fit = lf(env, "list")  # the planner's verdict for this machine (no GPU here: CPU)
    row = next(line for line in with_fit.stdout.splitlines() if line.startswith("tiny:1"))
    assert "CPU" in row or "GPU" in row

    data = json.loads(lf(env, "list", "--json", "--no-fit").stdout)
    (item,) = [d for d in data if d["name"] == "tiny:1"]
    assert item["path"] == str(tiny.resolve()) and item["size"] == tiny.stat().st_size

    shown = lf(env, "show", "tiny:1")
    assert shown.returncode == 0, shown.stderr
    assert str(tiny.resolve()) in shown.stdout
    assert "architecture" in shown.stdout and "llama" in shown.stdout
    assert "layers" in shown.stdout

    # rm asks first; with no answer nothing is removed.
    refused = lf(env, "rm", "tiny:1", stdin="\n")
    assert refused.returncode == 1 and "nothing removed" in refused.stderr
    assert "tiny:1" in lf(env, "list", "--no-fit").stdout

    removed = lf(env, "rm", "tiny:1", "--yes")
    assert removed.returncode == 0, removed.stderr
    assert "the file stays" in removed.stdout and tiny.is_file()
    assert "tiny:1" not in lf(env, "list", "--no-fit").stdout


def test_errors_are_one_line_with_exit_codes(env: dict[str, str], tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not gguf")
    bad = lf(env, "add", str(junk))
    assert bad.returncode == 3
    assert bad.stderr.startswith("localfab: error:") and "Traceback" not in bad.stderr

    unknown = lf(env, "show", "no-such-model")
    assert unknown.returncode == 3 and "localfab pull" in unknown.stderr

    gone = lf(env, "rm", "no-such-model", "--yes")
    assert gone.returncode == 3

    name = lf(env, "add", str(junk), "--name", "../../x")
    assert name.returncode in (2, 3) and "Traceback" not in name.stderr


@pytest.mark.slow  # many runs of the console script, each a new process
def test_pull_list_rm_through_the_fake_hub(env: dict[str, str], fake: FakeHub, tiny: Path) -> None:
    fake.add_file(REPO, FILE, data=tiny.read_bytes())
    pulled = lf(env, "pull", REPO)
    assert pulled.returncode == 0, pulled.stderr
    assert "pulled tiny-q4_k_m" in pulled.stdout and "sha256 verified" in pulled.stdout
    assert f"downloading {FILE}" in pulled.stderr  # progress goes to stderr

    again = lf(env, "pull", REPO)
    assert again.returncode == 0 and "already here" in again.stdout

    listed = lf(env, "list", "--no-fit")
    assert "tiny-q4_k_m" in listed.stdout
    shown = json.loads(lf(env, "show", "tiny-q4_k_m", "--json").stdout)
    path = Path(shown["path"])
    assert shown["source"] == "hub" and shown["repo"] == REPO and shown["facts"]["arch"] == "llama"
    assert path.is_file() and path.is_relative_to(Path(env["LOCALFAB_HOME"]))

    removed = lf(env, "rm", "tiny-q4_k_m", "-y")
    assert removed.returncode == 0 and "freed" in removed.stdout
    assert not path.exists()


@pytest.mark.slow  # many runs of the console script, each a new process
def test_pull_errors_exit_5_with_the_next_step(
    env: dict[str, str], fake: FakeHub, tiny: Path
) -> None:
    fake.add_file(REPO, FILE, data=tiny.read_bytes())
    fake.gate(REPO, "hf_good")
    gated = lf(env, "pull", REPO)
    assert gated.returncode == 5
    assert "gated" in gated.stderr and "HF_TOKEN" in gated.stderr
    assert "Traceback" not in gated.stderr

    with_token = lf(env, "pull", REPO, "--token", "hf_good", "-q")
    assert with_token.returncode == 0, with_token.stderr
    assert with_token.stderr == ""

    missing = lf(env, "pull", f"{REPO}:Q2_K", "--token", "hf_good")
    assert missing.returncode == 5 and "quants there: Q4_K_M" in missing.stderr


def test_list_catalog(env: dict[str, str]) -> None:
    out = lf(env, "list", "--catalog")
    assert out.returncode == 0
    assert "qwen2.5:7b" in out.stdout and "llama3.2:3b" in out.stdout
    items = json.loads(lf(env, "list", "--catalog", "--json").stdout)
    assert len(items) >= 12 and not any(i["downloaded"] for i in items)


def test_plan_before_download_reads_only_the_header(
    env: dict[str, str], fake: FakeHub, model_path: Path
) -> None:
    repo = "owner/gemma-3-270m-it-GGUF"
    fake.add_file(repo, "gemma-3-270m-it-Q4_K_M.gguf", disk=model_path)
    proc = lf(env, "plan", repo, "--profile", "rtx3060-laptop-6gb", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["arch"] == "gemma3" and data["fits"]
    assert data["n_gpu_layers"] == data["n_layer"] + 1  # everything on the 6 GB card
    assert 0 < data["header_bytes_fetched"] == fake.bytes_sent() < 16 * 2**20
    text = lf(env, "plan", f"{repo}:Q4_K_M", "--profile", "cpu-only-16gb")
    assert text.returncode == 0, text.stderr
    assert "planned before download" in text.stdout
    assert not list(Path(env["LOCALFAB_HOME"]).rglob("*.gguf"))  # nothing was downloaded


# progress and tables ---------------------------------------------------------------------------
def _events() -> list[Any]:
    from localfab.hub import DownloadProgress

    done = [DownloadProgress(FILE, 0, 1, n, 4096, 1024.0, 2.0, 0) for n in (0, 2048, 4096)]
    return [*done, DownloadProgress(FILE, 0, 1, 4096, 4096, 0.0, None, 0, stage="verify")]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_is_a_rich_bar() -> None:
    from localfab.commands.progress import ProgressLine

    out = _Terminal()
    bar = ProgressLine(stream=out)
    for event in _events():
        bar(event)
    bar.close()
    text = out.getvalue()
    assert f"downloading {FILE}, 4.0 KiB" in text and f"verifying sha256 of {FILE}" in text
    assert "━" in text and "\r" in text  # a bar, redrawn in place
    assert "4.0/4.0 KiB" in text and "100%" in text and "hashing" in text


def test_progress_in_a_pipe_is_a_few_plain_lines() -> None:
    from localfab.commands.progress import ProgressLine

    out = io.StringIO()
    bar = ProgressLine(stream=out)
    for event in _events():
        bar(event)
    bar.close()
    assert out.getvalue().splitlines() == [
        f"downloading {FILE}, 4.0 KiB",
        "  4.0 KiB / 4.0 KiB  100.0%  1.0 KiB/s  ETA 2s",
        f"verifying sha256 of {FILE}",
        "  4.0 KiB / 4.0 KiB  100.0%  hashing",
    ]


def test_tables_in_a_pipe_keep_one_row_per_line(env: dict[str, str]) -> None:
    """A narrow COLUMNS must not wrap a piped table: scripts split its rows by line."""
    out = lf(dict(env, COLUMNS="40"), "list", "--catalog")
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["NAME", "SIZE", "PARAMS", "CONTEXT", "LICENCE", "NOTE"]
    items = json.loads(lf(env, "list", "--catalog", "--json").stdout)
    assert len(rows) == len(items)
    for row, item in zip(rows, items, strict=True):
        assert row.startswith(item["name"] + " ") and row.endswith(item["note"])
        assert format_context(item["context_length"]) in row.split()  # as the TUI shows it
