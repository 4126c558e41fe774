"""API keys in the system keyring: `localfab remote key NAME` stores one, a remote without
api_key_env uses it, and a machine without a keyring gets one line that says what to do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keyring
import pytest
from click.testing import CliRunner
from keyring.backend import KeyringBackend
from keyring.backends.fail import Keyring as NoKeyring

from localfab.cli import cli
from localfab.remote.client import Remote, RemoteError
from localfab.remote.engine import RemoteEngine
from tests.remote.fakeremote import FakeRemote, fake_remote


class MemoryKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.kept.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.kept[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        from keyring.errors import PasswordDeleteError

        if self.kept.pop((service, username), None) is None:
            raise PasswordDeleteError("none")


@pytest.fixture()
def memory() -> Iterator[MemoryKeyring]:
    before = keyring.get_keyring()
    kept = MemoryKeyring()
    keyring.set_keyring(kept)
    yield kept
    keyring.set_keyring(before)


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as pair:
        yield pair


def test_a_stored_key_is_used(
    memory: MemoryKeyring, remote: tuple[FakeRemote, str], tmp_path: Any, monkeypatch: Any
) -> None:
    fake, url = remote
    fake.key = "sesame"
    monkeypatch.setenv("LOCALFAB_HOME", str(tmp_path))
    config = tmp_path / "config" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[remotes.box]\nurl = "{url}"\n')
    runner = CliRunner()
    done = runner.invoke(cli, ["remote", "key", "nope"], input="k\nk\n")
    assert done.exit_code != 0 and "no [remotes.nope]" in done.output
    done = runner.invoke(cli, ["remote", "key", "box"], input="sesame\nsesame\n")
    assert done.exit_code == 0, done.output
    assert "sesame" not in done.output
    assert memory.kept == {("localfab", "box"): "sesame"}
    from localfab.config import Config, default_paths
    from localfab.remote.named import named_remotes

    box = named_remotes(Config.load(default_paths()))["box"]
    RemoteEngine.connect(box).close()  # no api_key_env: the keyring's key
    fake.key = "other"
    with pytest.raises(RemoteError, match=r"401, the key in the system keyring"):
        RemoteEngine.connect(box)
    # A remote given as a URL never asks the keyring.
    assert Remote(url).api_key() is None
    done = runner.invoke(cli, ["remote", "key", "box", "--delete"])
    assert done.exit_code == 0 and memory.kept == {}
    done = runner.invoke(cli, ["remote", "key", "box", "--delete"])
    assert done.exit_code != 0 and "no key is stored" in done.output


def test_no_keyring_says_what_to_do(tmp_path: Any, monkeypatch: Any) -> None:
    before = keyring.get_keyring()
    keyring.set_keyring(NoKeyring())
    try:
        monkeypatch.setenv("LOCALFAB_HOME", str(tmp_path))
        config = tmp_path / "config" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text('[remotes.box]\nurl = "http://127.0.0.1:9"\n')
        done = CliRunner().invoke(cli, ["remote", "key", "box"], input="k\nk\n")
        assert done.exit_code != 0
        assert "no system keyring" in done.output and "api_key_env" in done.output
        assert Remote("http://x", "box", keyring=True).api_key() is None  # nothing breaks
    finally:
        keyring.set_keyring(before)
