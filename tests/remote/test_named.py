"""[remotes.NAME] in config.toml, and --remote as a name or a URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localfab.config import Config, default_paths
from localfab.errors import UsageError
from localfab.remote.client import Remote, base_url
from localfab.remote.named import named_remotes, resolve_remote


def _config(tmp_path: Path, text: str) -> Config:
    paths = default_paths({"LOCALFAB_HOME": str(tmp_path)})
    paths.config_file.parent.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(text)
    return Config.load(paths, env={})


def test_a_named_remote(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        '[remotes.box]\nurl = "https://box.lan:8080/v1"\napi_key_env = "BOX_KEY"\n'
        'model = "qwen3-32b"\ntimeout = 60\ncontext = 32768\n',
    )
    box = Remote("https://box.lan:8080/v1", "box", "qwen3-32b", "BOX_KEY", 60.0, 32768, True)
    assert named_remotes(config) == {"box": box}
    assert resolve_remote("box", config) == box
    # The command line's model and key variable win over the table's.
    other = resolve_remote("box", config, model="gemma3-4b", api_key_env="OTHER")
    assert (other.model, other.api_key_env, other.url) == ("gemma3-4b", "OTHER", box.url)
    assert base_url(box.url) == "https://box.lan:8080"


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ('api_key = "sk-123"', "api_key is not kept in config.toml"),
        ('url = "http://x"\nport = 1', "unknown key"),
        ("timeout = 1", "needs url"),
        ('url = "http://x"\ntimeout = -1', "timeout must be a number of seconds above 0"),
        ('url = "http://x"\ncontext = "big"', "context must be a number of tokens"),
        ('url = "http://x"\napi_key_env = "not a name"', "must name an environment variable"),
        ('url = "https://me:secret@x"', "a URL with a user or password"),
    ],
)
def test_mistakes_in_a_table(tmp_path: Path, table: str, says: str) -> None:
    config = _config(tmp_path, f"[remotes.box]\n{table}\n")
    with pytest.raises(UsageError, match=says) as caught:
        named_remotes(config)
    assert "[remotes.box]" in str(caught.value)


def test_a_url_or_an_unknown_name(tmp_path: Path) -> None:
    config = _config(tmp_path, '[remotes.box]\nurl = "http://box:8080"\n')
    assert resolve_remote("http://127.0.0.1:8080", config).url == "http://127.0.0.1:8080"
    assert resolve_remote("127.0.0.1:8080", config).url == "127.0.0.1:8080"
    assert base_url("127.0.0.1:8080") == "http://127.0.0.1:8080"
    with pytest.raises(UsageError, match=r"no remote named 'boxx' .*named: box"):
        resolve_remote("boxx", config)
    with pytest.raises(UsageError, match="must name an environment variable"):
        resolve_remote("box", config, api_key_env="$KEY")


def test_remote_list_names_each_server_and_its_models(tmp_path: Path, monkeypatch: Any) -> None:
    from click.testing import CliRunner

    from localfab.cli import cli
    from tests.remote.fakeremote import fake_remote
    from tests.serverproc import free_port

    with fake_remote() as (_, url):
        down = f"http://127.0.0.1:{free_port()}"
        _config(tmp_path, f'[remotes.box]\nurl = "{url}"\n[remotes.down]\nurl = "{down}"\n')
        monkeypatch.setenv("LOCALFAB_HOME", str(tmp_path))
        done = CliRunner().invoke(cli, ["remote", "list"])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[0] == f"box  {url}" and lines[1].startswith("  fake-7b")
    assert lines[2] == f"down  {down}" and "is the server running" in lines[3]


def test_chats_on_remotes_are_named_model_at_server() -> None:
    from localfab.commands.chat import remote_label, remote_named

    box = Remote("http://box:8080", "box", "qwen3-32b", keyring=True)
    known = {"box": box}
    assert remote_label(box) == "qwen3-32b@box"
    assert remote_named("qwen3-32b@box", known) == box
    assert remote_named("@box", known) == box  # the remote's own model
    assert remote_named("gemma3-4b@box", known).model == "gemma3-4b"  # type: ignore[union-attr]
    url = remote_named("m@http://127.0.0.1:8080", known)
    assert url is not None and (url.url, url.model) == ("http://127.0.0.1:8080", "m")
    assert remote_named("smollm2:135m", known) is None  # a local model
    assert remote_named("me@unknown", known) is None


def test_serving_on_an_open_address_needs_a_key(monkeypatch: Any) -> None:
    from localfab.commands.chat import serving_from_options

    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    assert serving_from_options("8080", 2, None) == (("127.0.0.1", 8080), 2)
    with pytest.raises(UsageError, match="anyone who can reach this machine"):
        serving_from_options("0.0.0.0:8080", 1, None)
    monkeypatch.setenv("LLAMA_API_KEY", "k")
    assert serving_from_options("0.0.0.0:8080", 1, None) == (("0.0.0.0", 8080), 1)
    with pytest.raises(UsageError, match="give a port"):
        serving_from_options("box", 1, None)
