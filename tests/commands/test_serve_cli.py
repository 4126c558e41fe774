"""`localfab serve` through the installed console script: flags, startup, warning, clean stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import LOCALFAB


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(LOCALFAB), "serve", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_health(url: str, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(url + "/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("server never became healthy")


def test_serve_help_lists_llama_server_flags(lf_env):
    out = subprocess.run(
        [str(LOCALFAB), "serve", "--help"], capture_output=True, text=True, env=lf_env
    )
    assert out.returncode == 0
    for flag in ("-m", "--host", "--port", "-c", "-ngl", "-fa", "-ctk", "-ctv", "--api-key",
                 "--alias", "--metrics", "--no-slots", "--context-shift", "-n", "--threads",
                 "-b", "-ub", "--seed", "--temp", "-np"):  # fmt: skip
        assert f"{flag}," in out.stdout or f"{flag} " in out.stdout, flag


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_answers_and_stops_cleanly(model_path: Path, lf_env, sig: signal.Signals):
    port = free_port()
    proc = start(
        ["-m", str(model_path), "--port", str(port), "-c", "1024", "--alias", "tiny",
         "--api-key", "k1", "--metrics", "-t", "2"],
        lf_env,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_health(url, proc)
        headers = {"Authorization": "Bearer k1"}
        assert httpx.get(url + "/v1/models").status_code == 401
        models = httpx.get(url + "/v1/models", headers=headers).json()
        assert models["data"][0]["id"] == "tiny"
        assert models["data"][0]["meta"]["n_ctx"] == 1024
        r = httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 2}, headers=headers)
        assert r.json()["tokens_predicted"] == 2
    finally:
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "server stopped" in err


def test_serve_warns_without_key_and_notes_the_rounded_context(model_path: Path, lf_env):
    port = free_port()
    proc = start([str(model_path), "--host", "0.0.0.0", "--port", str(port), "-c", "300"], lf_env)
    try:
        wait_health(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "without an API key" in err
    assert "note: context 300 became 512 tokens" in err


def test_serve_missing_model_is_one_clean_error(lf_env, tmp_path: Path):
    out = subprocess.run(
        [str(LOCALFAB), "serve", str(tmp_path / "nope.gguf")],
        capture_output=True,
        text=True,
        env=lf_env,
        timeout=60,
    )
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr and "localfab: error:" in out.stderr


def test_serve_speculates_with_the_flags_and_reports_drafts_in_timings(model_path: Path, lf_env):
    port = free_port()
    proc = start(
        [str(model_path), "--port", str(port), "-c", "1024", "-t", "2",
         "--spec-type", "ngram-simple", "--draft-max", "3"],
        lf_env,
    )  # fmt: skip
    words = "one two three four five six seven eight nine ten " * 3
    try:
        url = f"http://127.0.0.1:{port}"
        wait_health(url, proc, timeout=300)
        body = {"prompt": f"Repeat: {words}\n{words}", "n_predict": 32, "temperature": 0}
        timings = httpx.post(url + "/completion", json=body, timeout=120).json()["timings"]
        assert timings["draft_n"] > 0
        assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_serve_refuses_a_bad_draft_length_before_loading(model_path: Path, lf_env):
    out = subprocess.run(
        [str(LOCALFAB), "serve", str(model_path), "--spec-type", "ngram-simple",
         "--draft-max", "0"],
        capture_output=True, text=True, env=lf_env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--draft-max" in lines[0], out.stderr
