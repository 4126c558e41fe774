"""llama-server's flags that its own test suite passes, on `localfab serve`: accepted with
their meaning (--tags, --cors-origins, --spec-draft-n-max/min), or as what they are here
(--offline: nothing is downloaded while serving; --no-webui: there is no web UI; --ui says so)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.serverproc import ServerProcess

pytestmark = pytest.mark.model


def test_llama_servers_command_line_is_taken(model_path: Path) -> None:
    flags = (
        "--jinja",
        "--offline",
        "--no-webui",
        "--tags",
        "small,test",
        "--cors-origins",
        "localhost",
        "--spec-type",
        "ngram-simple",
        "--spec-draft-n-max",
        "8",
        "--spec-draft-n-min",
        "2",
    )
    server = ServerProcess(model_path, *flags).wait_ready()
    try:
        models = httpx.get(server.url + "/v1/models", timeout=10).json()
        assert models["data"][0]["tags"] == ["small", "test"]
        # Only local pages may call it (llama-server's `localhost`), as by default here.
        page = {"Origin": "https://evil.example"}
        assert httpx.get(server.url + "/health", headers=page, timeout=10).status_code == 403
        local = {"Origin": "http://localhost:3000"}
        assert httpx.get(server.url + "/health", headers=local, timeout=10).status_code == 200
        slots = httpx.get(server.url + "/slots", timeout=10).json()
        assert slots[0]["speculative"]
    finally:
        log = server.stop()
    assert "error" not in log.lower() and "no web UI" not in log


def test_asking_for_the_web_ui_says_there_is_none(model_path: Path) -> None:
    server = ServerProcess(model_path, "--ui").wait_ready()
    try:
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    finally:
        log = server.stop()
    assert "there is no web UI" in log


def test_a_sleep_of_zero_seconds_is_refused(lf_env: dict[str, str], tmp_path: Path) -> None:
    import subprocess

    from tests.conftest import LOCALFAB

    done = subprocess.run(
        [str(LOCALFAB), "serve", str(tmp_path / "none.gguf"), "--sleep-idle-seconds", "0"],
        env=lf_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--sleep-idle-seconds 0: give a number of seconds above 0, or -1" in done.stderr


def test_several_addresses_and_aliases(model_path: Path) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = ServerProcess(model_path, "--host", "127.0.0.1,::1", "--alias", "b-name,a-name")
    server.wait_ready()
    try:
        for host in ("127.0.0.1", "[::1]"):
            url = f"http://{host}:{server.port}"
            model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
            assert model["id"] == "a-name"  # the first in sorted order, as llama-server
            assert model["aliases"] == ["a-name", "b-name"]
            answer = httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 2})
            assert answer.status_code == 200 and answer.json()["model"] == "a-name"
    finally:
        server.stop()


def test_n_predict_is_the_default_not_a_cap(model_path: Path) -> None:
    # As llama-server: -n is the limit of a request that sets none; a request's own wins.
    server = ServerProcess(model_path, "-n", "3", "--temp", "0").wait_ready()
    try:
        base = {"prompt": "Once upon a time", "ignore_eos": True}
        plain = httpx.post(server.url + "/completion", json=base, timeout=60).json()
        longer = httpx.post(server.url + "/completion", json=base | {"n_predict": 7}, timeout=60)
        assert plain["tokens_predicted"] == 3
        assert longer.json()["tokens_predicted"] == 7
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--embedding"], "embeddings and reranking are not served"),
        (["--hf-repo", "org/repo"], "localfab pull"),
        (["--lora", "a.gguf"], "LoRA"),
        (["--tools", "all"], "left out on purpose"),
        (["--spec-synth-rates", "1,1"], "--spec-type"),
    ],
)
def test_flags_that_do_not_apply_are_refused_with_the_reason(
    lf_env: dict[str, str], tmp_path: Path, args: list[str], says: str
) -> None:
    import subprocess
    import sys

    localfab = Path(sys.executable).with_name("localfab")
    done = subprocess.run(
        [str(localfab), "serve", str(tmp_path / "m.gguf"), *args],
        env=lf_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "does not apply to localfab serve" in done.stderr and says in done.stderr
