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
from tests.engine.test_toolcalls import WEATHER
from tests.server.test_tools import CITY_ONLY
from tests.store.test_store import write_tiny_gguf


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


def run_json(model_path: Path, env: dict[str, str], *extra: str) -> dict:
    proc = lf(
        [
            "run",
            str(model_path),
            "The capital of France is",
            "--temperature",
            "0",
            "--raw",
            "--json",
            *extra,
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.model
def test_explicit_n_is_a_hard_cap(model_path: Path, lf_env):
    # As in llama.cpp: -n 8 means at most 8 tokens, with no automatic continuation.
    result = run_json(model_path, lf_env, "-n", "8")
    assert result["finish_reason"] == "length" and result["continues"] == 0
    assert result["usage"]["completion_tokens"] == 8
    assert result["timings"]["predicted_n"] == 8
    assert result["text"].strip()


@pytest.mark.model
def test_explicit_n_with_max_continues_continues(model_path: Path, lf_env):
    once = run_json(model_path, lf_env, "-n", "8")
    result = run_json(model_path, lf_env, "-n", "8", "--max-continues", "2")
    # A reply cut at -n is continued as a prefilled turn, joining without repeats.
    assert result["finish_reason"] == "length" and result["continues"] == 2
    assert result["usage"]["completion_tokens"] == 24
    assert result["timings"]["predicted_n"] == 8  # the first piece's timings
    assert result["text"].startswith(once["text"])


@pytest.mark.model
def test_configured_limit_is_continued(model_path: Path, lf_env):
    # Without -n the configured max_tokens applies, and max_continues (3) follow it.
    env = dict(lf_env, LOCALFAB_MAX_TOKENS="8")
    result = run_json(model_path, env)
    assert result["finish_reason"] == "length" and result["continues"] == 3
    assert result["usage"]["completion_tokens"] == 32
    none = run_json(model_path, dict(env, LOCALFAB_MAX_CONTINUES="0"))
    assert none["continues"] == 0 and none["usage"]["completion_tokens"] == 8


def test_help_says_n_is_a_hard_cap(lf_env):
    proc = lf(["run", "--help"], lf_env)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "a hard cap" in text
    assert "With an explicit -n, replies are continued only if this is given too" in text


@pytest.mark.model  # the embedded name is the real test model, loaded in the subprocess
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


def test_a_second_question_about_a_piped_document_restores_it_from_the_disk_cache(
    model_path: Path, lf_env
):
    document = "The harbour town of Kell has a lighthouse, a bakery and three boats. " * 50
    base = ["run", str(model_path), "-c", "2048", "-n", "4", "--temperature", "0", "-v"]
    first = lf([*base, "Who bakes?"], lf_env, stdin=document)
    second = lf([*base, "How many boats?", "--json"], lf_env, stdin=document)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "prompt cache: kept" in first.stderr and "restored" not in first.stderr
    timings = json.loads(second.stdout)["timings"]
    cached = timings["cache_n"]
    # All of the document came back; only the question (and the turn's end) was processed.
    assert cached > 600 and timings["prompt_n"] < 20
    assert f"{cached:,} prompt tokens restored from disk" in second.stderr
    off = lf([*base, "Who bakes?", "--no-prompt-cache", "--json"], lf_env, stdin=document)
    assert json.loads(off.stdout)["timings"]["cache_n"] == 0


def test_a_thinking_template_sends_the_thought_to_stderr_and_json_apart(model_path: Path, lf_env):
    # DeepSeek-R1's template opens the block in the prompt; the test model never closes it,
    # so all it writes is thought: stdout gets no answer, stderr (or reasoning_content) the
    # thought, and --hide-thinking prints it nowhere.
    template = Path(__file__).resolve().parents[1] / "engine" / "templates"
    base = ["run", str(model_path), "Hello there", "-n", "12", "--temperature", "0"]
    base += [
        "--chat-template-file",
        str(template / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"),
    ]
    shown = lf(base, lf_env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "" and "no chat template" not in shown.stderr
    thought = json.loads(lf([*base, "--json"], lf_env).stdout)
    assert thought["text"] == "" and thought["reasoning_content"]
    assert thought["reasoning_content"] in shown.stderr
    hidden = lf([*base, "--hide-thinking"], lf_env)
    assert thought["reasoning_content"] not in hidden.stderr
    missing = lf([*base[:-1], "nope.jinja"], lf_env)
    assert missing.returncode != 0 and "nope.jinja" in missing.stderr


# The weather tool with the city only (the test model writes a day count's digits on and on).
WEATHER_TOOLS = [{**WEATHER, "function": {**WEATHER["function"], "parameters": CITY_ONLY}}]


def test_tools_print_the_calls_as_json_lines(model_path: Path, lf_env, tmp_path):
    """`--tools FILE.json`: with a call asked for (a tool's name, or required) the reply's
    calls follow its text as JSON lines; --json gives them in `tool_calls`; a Qwen2.5 template
    reads them from its own `<tool_call>` markers, the test model's (none) from the generic."""
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": WEATHER_TOOLS}), encoding="utf-8")
    base = ["run", str(model_path), "Weather in Oslo?", "-n", "60", "--temperature", "0"]
    base += ["--tools", str(tools), "--no-ledger"]
    qwen = (
        Path(__file__).resolve().parents[1]
        / "engine"
        / "templates"
        / "Qwen-Qwen2.5-7B-Instruct.jinja"
    )
    for extra in ([], ["--chat-template-file", str(qwen)]):
        named = lf([*base, *extra, "--tool-choice", "get_weather"], lf_env)
        assert named.returncode == 0, named.stderr
        lines = [json.loads(line) for line in named.stdout.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0]["name"] == "get_weather", named.stdout
        assert isinstance(lines[0]["arguments"]["city"], str)
    whole = json.loads(lf([*base, "--tool-choice", "get_weather", "--json"], lf_env).stdout)
    assert [c["name"] for c in whole["tool_calls"]] == ["get_weather"]
    assert whole["finish_reason"] == "tool_calls" and whole["text"] == ""
    # required: one call or more (the test model goes on calling until the limit)
    some = json.loads(lf([*base, "--tool-choice", "required", "--json"], lf_env).stdout)
    assert some["tool_calls"] and "<tool_call>" not in some["text"]
    none = json.loads(lf([*base, "--tool-choice", "none", "--json"], lf_env).stdout)
    assert none["tool_calls"] == []


def test_bad_tools_files(lf_env, tmp_path, model_path: Path):
    bad = tmp_path / "bad.json"
    cases = [
        (tmp_path / "nope.json", "does not exist"),
        (bad, "is not JSON"),
        (bad, "tools must be an array"),
        (bad, "holds no tools"),
    ]
    contents = [None, "{nope", '{"tools": 3}', "[]"]
    for (path, needle), text in zip(cases, contents, strict=True):
        if text is not None:
            bad.write_text(text, encoding="utf-8")
        proc = lf(["run", str(model_path), "hi", "--tools", str(path)], lf_env)
        assert_one_clean_error(proc, 2, needle)
    raw = lf(["run", str(model_path), "hi", "--raw", "--tools", str(bad)], lf_env)
    assert_one_clean_error(raw, 2, "--raw")


def test_missing_file(lf_env, tmp_path):
    assert_one_clean_error(lf(["run", str(tmp_path / "nope.gguf"), "hi"], lf_env), 3, "nope.gguf")


def test_directory(lf_env, tmp_path):
    assert_one_clean_error(lf(["run", str(tmp_path), "hi"], lf_env), 3, "directory")


def test_not_gguf(lf_env, tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("just some text, not a model\n")
    assert_one_clean_error(lf(["run", str(bad), "hi"], lf_env), 3, "not a GGUF file")


def test_truncated_gguf(lf_env, tmp_path):
    whole = write_tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])  # the header is whole, the tensor data is not
    proc = lf(["run", str(cut), "hi"], lf_env)
    assert_one_clean_error(proc, 3, "cut.gguf")
    # found from the header before loading ("may be truncated" would be llama.cpp's failure)
    assert "the file is truncated" in proc.stderr


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
def test_bad_max_tokens(lf_env, tmp_path, value):
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")  # refused before any model is loaded
    assert_one_clean_error(lf(["run", str(tiny), "hi", "-n", value], lf_env), 2, "--max-tokens")


def test_no_prompt(lf_env, tmp_path):
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert_one_clean_error(lf(["run", str(tiny)], lf_env), 2, "no prompt")


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


@pytest.mark.model
def test_thread_counts_below_one_are_refused_and_minus_one_is_auto(model_path: Path, lf_env):
    base = ["run", str(model_path), "Hi", "-n", "2", "--raw"]
    assert_one_clean_error(lf([*base, "-t", "-5"], lf_env), 2, "-t/--threads must be 1 to")
    assert_one_clean_error(lf([*base, "-t", "5000"], lf_env), 2, "-t/--threads must be 1 to")
    auto = lf([*base, "-t", "-1"], lf_env)
    assert auto.returncode == 0, auto.stderr
    env = dict(lf_env, LOCALFAB_THREADS="-2")
    assert_one_clean_error(lf(base, env), 2, "LOCALFAB_THREADS: threads must be")
    config = Path(lf_env["LOCALFAB_HOME"]) / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("threads = -5\n")
    assert_one_clean_error(lf(base, lf_env), 2, "config.toml: threads must be")
    serve = lf(["serve", str(model_path), "-t", "-5", "--port", "0"], lf_env)
    assert_one_clean_error(serve, 2, "threads must be")
