"""`localfab run` through the installed console script: output, options and every bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LOCALFAB


def lf(args: list[str], env: dict[str, str], *, stdin: str | None = None, timeout: float = 300):
    return subprocess.run(
        [str(LOCALFAB), *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def assert_one_clean_error(
    proc: subprocess.CompletedProcess[str], code: int, *needles: str
) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("localfab: error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_help_does_not_import_llama_cpp_or_textual():
    code = (
        "import sys\n"
        "from localfab.cli import cli\n"
        "try:\n"
        "    cli(['--help'], prog_name='localfab')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('llama_cpp', 'textual', 'huggingface_hub') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout
    assert "Exit codes" in out.stdout and "130" in out.stdout


def test_run_streams_answer_json(model_path: Path, lf_env):
    proc = lf(
        [
            "run",
            str(model_path),
            "The capital of France is",
            "-n",
            "12",
            "--temperature",
            "0",
            "--raw",
            "--json",
        ],
        lf_env,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # A reply cut at -n is continued (3 times by default) as a prefilled turn.
    assert result["finish_reason"] == "length" and result["continues"] == 3
    assert result["usage"]["completion_tokens"] == 48
    assert result["timings"]["predicted_n"] == 12  # the first piece's timings
    assert result["text"].strip()
    once = lf(
        [
            "run",
            str(model_path),
            "The capital of France is",
            "-n",
            "12",
            "--temperature",
            "0",
            "--raw",
            "--json",
            "--max-continues",
            "0",
        ],
        lf_env,
    )
    single = json.loads(once.stdout)
    assert single["continues"] == 0 and single["usage"]["completion_tokens"] == 12
    assert result["text"].startswith(single["text"])


def test_run_embedded_name_with_template_and_verbose(lf_env):
    proc = lf(["run", "gemma3:270m", "Hello", "-n", "8", "--temperature", "0", "-v"], lf_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "built-in 'gemma' template" in proc.stderr
    assert "TTFT" in proc.stderr and "decode" in proc.stderr and "tok/s" in proc.stderr
    # run loads through the planner and -v shows the plan it used.
    assert "Plan for" in proc.stderr and "context (-c)" in proc.stderr


def test_piped_stdin_is_added_to_the_prompt(model_path: Path, lf_env):
    base = ["run", str(model_path), "--raw", "-n", "6", "--temperature", "0", "--json"]
    piped = lf([*base, "Summarize:"], lf_env, stdin="Alpha beta gamma delta.")
    only_args = lf([*base, "Summarize:"], lf_env)
    assert piped.returncode == 0 and only_args.returncode == 0
    n_piped = json.loads(piped.stdout)["usage"]["prompt_tokens"]
    n_args = json.loads(only_args.stdout)["usage"]["prompt_tokens"]
    assert n_piped > n_args


def test_missing_file(lf_env, tmp_path):
    assert_one_clean_error(lf(["run", str(tmp_path / "nope.gguf"), "hi"], lf_env), 3, "nope.gguf")


def test_directory(lf_env, tmp_path):
    assert_one_clean_error(lf(["run", str(tmp_path), "hi"], lf_env), 3, "directory")


def test_not_gguf(lf_env, tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("just some text, not a model\n")
    assert_one_clean_error(lf(["run", str(bad), "hi"], lf_env), 3, "not a GGUF file")


def test_truncated_gguf(model_path: Path, lf_env, tmp_path):
    cut = tmp_path / "cut.gguf"
    with model_path.open("rb") as src, cut.open("wb") as dst:
        dst.write(src.read(8 * 1024 * 1024))
    proc = lf(["run", str(cut), "hi"], lf_env)
    assert_one_clean_error(proc, 3, "cut.gguf")
    assert "truncated" in proc.stderr


def test_unknown_model_name(lf_env):
    proc = lf(["run", "no-such-model:1b", "hi"], lf_env)
    assert_one_clean_error(proc, 3, "no-such-model:1b")


def test_prompt_longer_than_context(model_path: Path, lf_env):
    proc = lf(["run", str(model_path), "-c", "64", "--raw", "word " * 600], lf_env)
    assert_one_clean_error(proc, 4, "context window holds 256")
    assert "context 64 became 256 tokens" in proc.stderr
    assert "602 tokens" in proc.stderr


def test_context_beyond_training_is_noted(model_path: Path, lf_env):
    proc = lf(["run", str(model_path), "-c", "33000", "-n", "1", "Hi"], lf_env)
    assert proc.returncode == 0, proc.stderr
    assert "context 33000 became 33024 tokens" in proc.stderr
    assert "larger than the 32768 tokens the model was trained on" in proc.stderr


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_max_tokens(model_path: Path, lf_env, value):
    assert_one_clean_error(
        lf(["run", str(model_path), "hi", "-n", value], lf_env), 2, "--max-tokens"
    )


def test_no_prompt(model_path: Path, lf_env):
    assert_one_clean_error(lf(["run", str(model_path)], lf_env), 2, "no prompt")


def test_context_beyond_training_warns_and_runs(model_path: Path, lf_env):
    proc = lf(["run", str(model_path), "Hi", "-c", "40000", "-n", "2", "--raw"], lf_env)
    assert proc.returncode == 0, proc.stderr
    assert "larger than the 32768 tokens the model was trained on" in proc.stderr


def test_ctrl_c_keeps_output_and_exits_130(model_path: Path, lf_env):
    proc = subprocess.Popen(
        [
            str(LOCALFAB),
            "run",
            str(model_path),
            "Tell me a long story about",
            "--raw",
            "-n",
            "2000",
            "--temperature",
            "0.7",
            "--seed",
            "3",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=lf_env,
    )
    assert proc.stdout is not None
    first = b""
    while len(first) < 10:  # the answer has started streaming
        chunk = os.read(proc.stdout.fileno(), 64)
        assert chunk, "the answer ended before Ctrl-C"
        first += chunk
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err
    # What was printed before Ctrl-C stays printed; the line is closed on stderr, not erased.
    assert b"\x1b" not in first + out


def test_console_script_exists():
    assert shutil.which(str(LOCALFAB))
