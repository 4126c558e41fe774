"""The [keys] table of config.toml: read in order, shape checked, kept apart from settings."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from localfab.config import Config, Paths, default_paths, save_settings
from localfab.errors import UsageError


@pytest.fixture()
def paths(tmp_path: Path) -> Paths:
    return default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})


def write_config(paths: Paths, text: str) -> None:
    paths.config_file.parent.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(text, encoding="utf-8")


def test_keys_table_is_read_with_short_quoted_and_nested_ids(paths: Paths) -> None:
    write_config(
        paths,
        'theme = "localfab-light"\n\n[keys]\nstop = "ctrl+x"\n"chat.new" = " f6 "\n\n'
        '[keys.sessions]\nrename = "f2,ctrl+e"\n',
    )
    config = Config.load(paths, env={})
    assert config.theme == "localfab-light"
    assert config.keys == (
        ("stop", "ctrl+x"),
        ("chat.new", "f6"),
        ("sessions.rename", "f2,ctrl+e"),
    )


def test_no_keys_table_means_default_keys(paths: Paths) -> None:
    write_config(paths, "max_tokens = 100\n")
    assert Config.load(paths, env={}).keys == ()
    assert Config().keys == ()


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("keys = 5", "keys must be a table of action ids and key names"),
        ("[keys]\nstop = 5", 'keys.stop must be key names such as "ctrl+x"'),
        ('[keys]\nstop = ""', "keys.stop must be key names"),
        ("[keys]\nstop = [1]", "keys.stop must be key names"),
    ],
)
def test_a_keys_table_of_the_wrong_shape_is_one_usage_error(
    paths: Paths, toml: str, needle: str
) -> None:
    write_config(paths, toml + "\n")
    with pytest.raises(UsageError) as err:
        Config.load(paths, env={})
    assert needle in str(err.value)
    assert str(paths.config_file) in str(err.value)


def test_keys_cannot_be_set_from_the_environment(paths: Paths) -> None:
    assert Config.load(paths, env={"LOCALFAB_KEYS": "stop=ctrl+x"}).keys == ()


def test_saving_a_setting_keeps_it_out_of_the_keys_table(paths: Paths) -> None:
    write_config(paths, '# mine\nmax_tokens = 100\n\n[keys]\nstop = "ctrl+x"\n')
    config = save_settings(paths, {"theme": "localfab-light", "max_tokens": 200})
    assert config.theme == "localfab-light"
    assert config.max_tokens == 200
    assert config.keys == (("stop", "ctrl+x"),)
    data = tomllib.loads(paths.config_file.read_text(encoding="utf-8"))
    assert data["keys"] == {"stop": "ctrl+x"}
    assert paths.config_file.read_text(encoding="utf-8").startswith("# mine\n")


def test_saving_keys_as_a_setting_is_refused(paths: Paths) -> None:
    with pytest.raises(UsageError, match=r"\[keys\] table"):
        save_settings(paths, {"keys": "stop=ctrl+x"})
