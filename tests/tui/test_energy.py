"""The status bar's energy slot: J/token of the last reply where the machine reports power,
a dash where it does not. Fake engine; the energy probe reads a fake amdgpu hwmon tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab.machine.energy import EnergyMeter, survey
from localfab.tui.local_backend import LocalBackend
from tests.fake_engine import FakeEngine
from tests.machine.test_energy import hwmon, no_nvml
from tests.tui_support import build_app, wait_for


def energy_label(app: object) -> str:
    return str(app.chat.query_one("#status-energy").render())  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_a_reply_shows_its_energy_per_token(history, tmp_path: Path) -> None:
    hwmon(tmp_path, 0, "amdgpu", power1_input=15_000_000)  # 15 W, sampled
    app, _ = build_app(history, engine=FakeEngine(delay=0.01))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded)
        assert energy_label(app) == "— J/tok"
        backend = app.backend
        assert isinstance(backend, LocalBackend) and backend._recorder is not None
        backend._recorder.meter = EnergyMeter(survey(tmp_path, find_nvml=no_nvml).probes,
                                              interval=0.005)  # fmt: skip
        await pilot.press(*"hello", "enter")
        await wait_for(pilot, lambda: app.chat.replies_finished == 1)
        recorder = backend._recorder
        assert recorder.energy is not None and recorder.energy.joules
        shown = energy_label(app)
        assert shown.endswith(" J/tok") and shown != "— J/tok"
        # One clock tick per streamed token; the end-of-generation token may count as well.
        ticks = len(recorder.clock.times)
        per_token = float(shown.split()[0])
        assert any(
            per_token == pytest.approx(recorder.energy.joules / n, rel=0.01)
            for n in (ticks, ticks + 1)
        )


@pytest.mark.anyio
async def test_without_a_power_source_the_slot_stays_a_dash(history) -> None:
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.chat.loaded)
        backend = app.backend
        assert isinstance(backend, LocalBackend) and backend._recorder is not None
        backend._recorder.meter = EnergyMeter([])
        await pilot.press(*"hello", "enter")
        await wait_for(pilot, lambda: app.chat.replies_finished == 1)
        assert energy_label(app) == "— J/tok"
