"""The fake-hub fixtures the hub tests share: a local server speaking Hugging Face's endpoints,
an environment pointed at it with no token, a store, and small GGUF payloads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localfab.hub import Hub, HubConfig
from localfab.store import Store
from tests.hf_server import FakeHub
from tests.store.test_store import write_tiny_gguf


@pytest.fixture()
def fake() -> Iterator[FakeHub]:
    with FakeHub() as hub:
        yield hub


@pytest.fixture()
def other() -> Iterator[FakeHub]:
    """A second server on another port: another origin, i.e. not the configured hub."""
    with FakeHub() as hub:
        yield hub


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch, fake: FakeHub, tmp_path: Path) -> Path:
    """HF_ENDPOINT at the fake hub, no token, nothing else reaching out; returns LOCALFAB_HOME."""
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved token is picked up
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALFAB_HOME", str(home))
    return home


@pytest.fixture()
def store(env: Path) -> Store:
    return Store()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A valid GGUF of about 1 MiB."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "t.gguf").read_bytes()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A valid GGUF of about 24 MiB: big enough that a drop after 15 MiB leaves 10 MiB on disk."""
    path = tmp_path_factory.mktemp("big") / "b.gguf"
    return write_tiny_gguf(path, floats=6 * 1024 * 1024).read_bytes()


def hub() -> Hub:
    """A Hub configured from the environment at call time (as the CLI does)."""
    return Hub(HubConfig.from_env())
