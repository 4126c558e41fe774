"""`localfab serve` takes its default sampling from config.toml / LOCALFAB_*, under its flags.

A client's `max_tokens` / `n_predict` is a hard cap, as in llama-server: the configured
`max_continues` (3 by default) does not continue server replies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localfab.commands.serve import sampling_defaults
from localfab.config import Config
from localfab.engine.types import SamplingParams
from localfab.server.settings import ServerSettings
from tests.serverproc import serve

CONFIG = """\
temperature = 0.3
top_k = 7
top_p = 0.9
min_p = 0.2
repeat_penalty = 1.3
"""


@pytest.fixture(scope="module")
def server_url(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server started with config.toml, one LOCALFAB_* variable and --top-k."""
    home = tmp_path_factory.mktemp("serve-sampling")
    (home / "config").mkdir()
    (home / "config" / "config.toml").write_text(CONFIG, encoding="utf-8")
    env = dict(os.environ, LOCALFAB_HOME=str(home))
    env.pop("HF_TOKEN", None)
    env["LOCALFAB_TOP_P"] = "0.5"  # the environment outranks config.toml
    with serve(model_path, "--top-k", "3", env=env) as server:
        yield server.url


@pytest.fixture(scope="module")
def props(server_url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(server_url + "/props", timeout=30).json()
    return data["default_generation_settings"]["params"]


@pytest.mark.model
def test_serve_takes_the_configured_temperature(props: dict[str, Any]) -> None:
    assert props["temperature"] == pytest.approx(0.3)  # config.toml, not the built-in 0.8


@pytest.mark.model
def test_serve_takes_the_configured_sampling(props: dict[str, Any]) -> None:
    assert props["top_k"] == 3  # --top-k beats config.toml's 7
    assert props["top_p"] == pytest.approx(0.5)  # LOCALFAB_TOP_P beats config.toml's 0.9
    assert props["min_p"] == pytest.approx(0.2)
    assert props["repeat_penalty"] == pytest.approx(1.3)


def test_sampling_precedence_flag_then_config_then_built_in() -> None:
    built_in = SamplingParams()
    assert sampling_defaults({}, Config()) == {
        "temperature": built_in.temperature,
        "top_k": built_in.top_k,
        "top_p": built_in.top_p,
        "min_p": built_in.min_p,
        "repeat_penalty": built_in.repeat_penalty,
    }
    config = Config(temperature=0.3, top_k=7, top_p=0.9, min_p=0.2, repeat_penalty=1.3)
    chosen = sampling_defaults({"temp": 0.0, "top_k": None, "min_p": 0.0}, config)
    # an explicit 0 is a choice, not "unset"
    assert chosen == {
        "temperature": 0.0,
        "top_k": 7,
        "top_p": 0.9,
        "min_p": 0.0,
        "repeat_penalty": 1.3,
    }
    # the server's own defaults are the engine's
    settings = ServerSettings()
    assert (settings.temperature, settings.top_k, settings.top_p) == (
        built_in.temperature,
        built_in.top_k,
        built_in.top_p,
    )


@pytest.mark.model
def test_client_max_tokens_is_a_hard_cap(server_url: str) -> None:
    # A reply cut at the client's limit ends there: no automatic continuation, as llama-server.
    body = {"prompt": "Once upon a time", "n_predict": 8, "ignore_eos": True, "temperature": 0}
    done = httpx.post(server_url + "/completion", json=body, timeout=120).json()
    assert done["tokens_predicted"] == 8 and done["stop_type"] == "limit"
    chat = {
        "messages": [{"role": "user", "content": "Tell a long story about the sea."}],
        "max_tokens": 8,
        "ignore_eos": True,
        "temperature": 0,
    }
    reply = httpx.post(server_url + "/v1/chat/completions", json=chat, timeout=120).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 8
