"""An offline machine fails fast: `pull`, `plan OWNER/REPO` and the models screen say the hub is
unreachable in one line, without the hub library's retries (about 24 s and its retry lines
before); `plan NAME` and the models screen give a catalog model's fit from the catalog's facts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from localfab.store.catalog import load_catalog
from tests.conftest import LOCALFAB
from tests.hf_server import FakeHub
from tests.tui.test_models_hub import build, catalog, cell, detail, select
from tests.tui_support import wait_for


def closed_port() -> str:
    with FakeHub() as dead:
        url = dead.url
    return url  # nobody listens there once it stopped


OFFLINE = {"closed port": closed_port, "unresolvable name": lambda: "http://hub.invalid"}


@pytest.mark.slow  # two runs of the console script per endpoint
@pytest.mark.parametrize("endpoint", list(OFFLINE), ids=list(OFFLINE))
def test_pull_and_plan_say_offline_in_one_line(endpoint: str, lf_env: dict[str, str]) -> None:
    env = dict(lf_env, HF_ENDPOINT=OFFLINE[endpoint]())
    for args in (["pull", "qwen2.5:0.5b"], ["plan", "bartowski/Qwen2.5-7B-Instruct-GGUF"]):
        proc = subprocess.run(
            [str(LOCALFAB), *args], capture_output=True, text=True, env=env, timeout=120
        )
        assert proc.returncode == 5, proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "looks offline" in lines[0], proc.stderr
        assert "Retry" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # a run of the console script per endpoint
@pytest.mark.parametrize("endpoint", list(OFFLINE), ids=list(OFFLINE))
def test_plan_of_a_catalog_model_offline_gives_the_catalogs_fit(
    endpoint: str, lf_env: dict[str, str]
) -> None:
    env = dict(lf_env, HF_ENDPOINT=OFFLINE[endpoint]())
    proc = subprocess.run(
        [str(LOCALFAB), "plan", "qwen2.5:7b"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "Plan for" in proc.stdout and "GPU layers" in proc.stdout
    assert "offline" in proc.stdout and "planned from the catalog's facts of qwen2.5:7b" in (
        " ".join(proc.stdout.split())
    )


@pytest.mark.anyio
async def test_the_models_screen_says_offline_without_waiting_for_retries(
    env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.utils._http as http

    waits: list[float] = []
    monkeypatch.setattr(http.time, "sleep", waits.append)  # the library's backoff waits
    monkeypatch.setenv("HF_ENDPOINT", closed_port())
    entries = list(load_catalog())
    app, history = build(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await catalog(pilot, app)

        def fit(name: str) -> str:
            return cell(screen, name, "fit")

        # Every catalog model has shipped facts: its fit is estimated at once, marked.
        await wait_for(pilot, lambda: all(fit(e.name).startswith("≈") for e in entries))
        assert any("GPU" in fit(e.name) or "CPU" in fit(e.name) for e in entries)
        await select(pilot, screen, entries[0].name)
        assert "cannot be reached" in detail(screen)
        assert "estimated from the catalog's facts" in detail(screen)
    history.close()
    assert waits == []  # no request reached the library's retries
