"""The models screen on the real hub client and store, against the local fake hub.

HF_ENDPOINT points at `tests/hf_server.py` (the `env` fixture): the catalog's fit comes from
real header reads, pulls are real `Hub.pull` downloads into a real store, and failures carry
the hub's own messages.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from localfab.chat.history import History
from localfab.config import default_paths
from localfab.store import Store
from localfab.store.catalog import load_catalog
from localfab.tui.app import AppDeps, LocalfabApp, make_app
from localfab.tui.models import LocalModels
from localfab.tui.screens.models import ModelsScreen
from localfab.tui.widgets.confirm import ConfirmDialog
from tests.hf_server import FakeHub
from tests.hub.test_hub import CHUNK
from tests.tui_support import wait_for

pytestmark = pytest.mark.anyio

ENTRIES = list(load_catalog())
FIRST, SECOND = ENTRIES[0], ENTRIES[1]


def build(tmp_path: Path) -> tuple[LocalfabApp, History]:
    history = History(tmp_path / "sessions.sqlite3")
    return make_app(
        AppDeps(backend=None, history=history, models=LocalModels(default_paths()))
    ), history


async def catalog(pilot: Pilot[None], app: LocalfabApp) -> ModelsScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
    screen = app.screen
    assert isinstance(screen, ModelsScreen)
    await pilot.press("c")
    table = screen.query_one("#catalog-table", DataTable)
    await wait_for(pilot, lambda: table.row_count == len(ENTRIES))
    return screen


def cell(screen: ModelsScreen, name: str, column: str) -> str:
    return str(screen.query_one("#catalog-table", DataTable).get_cell(name, column))


async def select(pilot: Pilot[None], screen: ModelsScreen, name: str) -> None:
    table = screen.query_one("#catalog-table", DataTable)
    table.focus()
    table.move_cursor(row=table.get_row_index(name))
    await pilot.pause()


def detail(screen: ModelsScreen) -> str:
    return str(screen.query_one("#catalog-detail", Static).render())


async def test_catalog_fit_from_the_remote_header_and_a_real_pull_lands_in_the_store(
    env: Path, fake: FakeHub, tiny: bytes, big: bytes, tmp_path: Path
) -> None:
    fake.add_file(FIRST.repo, FIRST.files[0], data=big)
    fake.add_file(SECOND.repo, SECOND.files[0], data=tiny)
    fake.gate(SECOND.repo, "a-token-we-do-not-have")
    app, history = build(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await catalog(pilot, app)
        done = lambda: all(  # noqa: E731
            cell(screen, e.name, "fit") not in ("checking…", "") for e in ENTRIES
        )
        await wait_for(pilot, done, seconds=60)
        # the hosted model's header was read and judged; nothing was downloaded for it
        assert cell(screen, FIRST.name, "fit") not in ("can't check", "-")
        assert fake.bytes_sent() < len(big) // 10
        assert Store().partial_files() == []
        # models the hub does not have, or will not give, fail per row with the hub's advice
        assert cell(screen, ENTRIES[3].name, "fit") == "can't check"
        await select(pilot, screen, SECOND.name)
        assert "gated" in detail(screen) and "HF_TOKEN" in detail(screen)
        await select(pilot, screen, ENTRIES[3].name)
        assert "HTTP 404" in detail(screen)

        await select(pilot, screen, FIRST.name)
        await pilot.press("p")
        await wait_for(pilot, lambda: cell(screen, FIRST.name, "status") == "here", seconds=30)
        entry = Store().get(FIRST.name)
        assert entry is not None and entry.path.read_bytes() == big
        local = screen.query_one("#models-table", DataTable)
        await wait_for(pilot, lambda: FIRST.name in {str(k.value) for k in local.rows})
        assert any(f"pulled {FIRST.name}" in n.message for n in app._notifications)

        # remove it again, through the confirmation: the store deletes the files it owns
        await pilot.press("l")
        local.focus()
        local.move_cursor(row=local.get_row_index(FIRST.name))
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog))
        assert "delete 24.0 MiB of files" in str(app.screen.query_one(".dialog-body").render())
        await pilot.press("y")
        await wait_for(pilot, lambda: FIRST.name not in {str(k.value) for k in local.rows})
        assert Store().get(FIRST.name) is None and not entry.path.exists()
        await pilot.press("c")

        # a gated model: the pull fails with what to do, and nothing is registered
        await select(pilot, screen, SECOND.name)
        await pilot.press("p")
        await wait_for(pilot, lambda: cell(screen, SECOND.name, "status") == "failed")
        assert "HF_TOKEN" in detail(screen)
        assert Store().get(SECOND.name) is None
    history.close()


@pytest.mark.slow  # 24 MiB through real downloads, twice, and two app starts
async def test_a_failed_pull_resumes_after_a_restart_and_a_running_one_cancels(
    env: Path, fake: FakeHub, big: bytes, tmp_path: Path
) -> None:
    fake.add_file(FIRST.repo, FIRST.files[0], data=big)
    app, history = build(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await catalog(pilot, app)
        await wait_for(pilot, lambda: cell(screen, FIRST.name, "fit") not in ("checking…", ""))
        # the header read is done: the next download drops, and the library's retry fails too
        fake.drop(FIRST.repo, FIRST.files[0], after=CHUNK + 1000)
        fake.error_once(FIRST.repo, FIRST.files[0], 500)
        await select(pilot, screen, FIRST.name)
        await pilot.press("p")
        await wait_for(pilot, lambda: cell(screen, FIRST.name, "status") == "failed", seconds=30)
        assert "HTTP 500" in detail(screen) and "kept" in detail(screen)
    history.close()

    # a new app (a restart) sees the kept bytes and resumes from them
    app, history = build(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await catalog(pilot, app)
        assert cell(screen, FIRST.name, "status") == "10.0 MiB kept"
        await select(pilot, screen, FIRST.name)
        await pilot.press("p")
        await wait_for(pilot, lambda: cell(screen, FIRST.name, "status") == "here", seconds=30)
        last = fake.content_gets(FIRST.files[0])[-1]
        assert last.range == f"bytes={CHUNK}-"
        entry = Store().get(FIRST.name)
        assert entry is not None and entry.path.read_bytes() == big

        # a pull that is running stops on Cancel and keeps what it has for the next pull
        judged = lambda: all(  # noqa: E731
            cell(screen, e.name, "fit") not in ("checking…", "") for e in ENTRIES
        )
        await wait_for(pilot, judged, seconds=60)  # no header read is still on its way
        fake.add_file(SECOND.repo, SECOND.files[0], data=big)
        gate = fake.hold()
        before = fake.started_gets()
        await select(pilot, screen, SECOND.name)
        await pilot.press("p")
        await wait_for(pilot, lambda: fake.started_gets() > before)  # its GET has arrived
        assert cell(screen, SECOND.name, "status") in ("0%", "starting")
        await pilot.press("x")
        gate.set()
        await wait_for(pilot, lambda: cell(screen, SECOND.name, "status") == "cancelled")
        assert Store().get(SECOND.name) is None
    history.close()


def test_local_models_on_the_real_store_with_the_planner_verdict(
    env: Path, model_path: Path, tmp_path: Path
) -> None:
    """The local list of a real store: the test model added by path, judged by the planner."""
    Store().add(model_path, name="gemma-test")
    models = LocalModels(default_paths())
    (row,) = [r for r in models.rows() if r.name == "gemma-test"]
    assert (row.quant, row.arch, row.last_used) == ("Q4_K_M", "gemma3", "never")
    assert row.size.endswith("MiB") and row.path == model_path
    verdict = models.fit(row)
    assert verdict is not None and verdict.split()[-1].endswith("k")
    # a model added by path is forgotten, never deleted
    assert models.removal_question("gemma-test") == (
        f"Forget gemma-test? The file stays at {model_path}."
    )
    assert models.remove("gemma-test") == f"forgot gemma-test; the file stays at {model_path}"
    assert model_path.is_file() and Store().get("gemma-test") is None
