"""`localfab run --remote`: the one-shot answer from a server, and the options that cannot
apply to one."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LOCALFAB
from tests.remote.fakeremote import FakeRemote, fake_remote
from tests.serverproc import ServerProcess


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as pair:
        yield pair


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), "run", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_run_answers_from_the_server(
    remote: tuple[FakeRemote, str], lf_env: dict[str, str]
) -> None:
    fake, url = remote
    done = _run(lf_env, "--remote", url, "-", "Hi", "--temp", "0", "-v")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Hello there"
    assert fake.requests[-1]["temperature"] == 0.0
    assert "energy" not in done.stderr  # the server's energy is not this machine's


def test_run_on_a_named_remote(
    remote: tuple[FakeRemote, str], lf_env: dict[str, str], tmp_path: Path
) -> None:
    fake, url = remote
    fake.key = "k-123"
    config = Path(lf_env["LOCALFAB_HOME"]) / "config" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[remotes.box]\nurl = "{url}"\napi_key_env = "BOX_KEY"\n')
    refused = _run(lf_env, "--remote", "box", "-", "Hi")
    assert refused.returncode != 0
    assert "BOX_KEY holds no API key" in refused.stderr
    done = _run({**lf_env, "BOX_KEY": "k-123"}, "--remote", "box", "-", "Hi")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Hello there"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("-c", "512"), "--ctx-size: these set how a model loads here"),
        (("--spec-type", "ngram-simple"), "--spec-type: these set how a model loads here"),
        (("--prompt-cache",), "--prompt-cache: these set how a model loads here"),
    ],
)
def test_local_options_are_refused_with_a_remote(
    remote: tuple[FakeRemote, str], lf_env: dict[str, str], args: tuple[str, ...], says: str
) -> None:
    _, url = remote
    done = _run(lf_env, "--remote", url, *args, "-", "Hi")
    assert done.returncode != 0 and says in done.stderr, done.stderr


def test_a_down_server_is_one_line(lf_env: dict[str, str]) -> None:
    from tests.serverproc import free_port

    done = _run(lf_env, "--remote", f"http://127.0.0.1:{free_port()}", "-", "Hi")
    assert done.returncode != 0
    assert "is the server running" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.model
def test_run_remote_is_run_local(
    model_server: ServerProcess, model_path: Path, lf_env: dict[str, str]
) -> None:
    """On `localfab serve`, the remote answer is the local one, token for token (greedy);
    on llama-server (its own fallback template for a model without one) an answer."""
    args = ("The capital of France is", "--temp", "0", "-n", "16")
    remote = _run(lf_env, "--remote", model_server.url, "-", *args)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout.strip()
    if model_server.program is None:
        local = _run(lf_env, str(model_path), *args)
        assert local.returncode == 0, local.stderr
        assert remote.stdout == local.stdout
