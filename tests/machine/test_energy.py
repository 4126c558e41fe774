"""Energy probes on fake sysfs trees and a fake NVML; energy per generation with faults."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from localfab.machine import energy
from localfab.machine.energy import EnergyMeter, ProbeError, survey


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def rapl_zone(root: Path, n: int, name: str, energy_uj: int, max_uj: int) -> Path:
    zone = root / f"sys/class/powercap/intel-rapl:{n}"
    write(zone / "name", name + "\n")
    write(zone / "energy_uj", f"{energy_uj}\n")
    write(zone / "max_energy_range_uj", f"{max_uj}\n")
    # A sub-zone (cores) must not be counted on top of its package.
    sub = root / f"sys/class/powercap/intel-rapl:{n}:0"
    write(sub / "name", "core\n")
    write(sub / "energy_uj", "5\n")
    write(sub / "max_energy_range_uj", f"{max_uj}\n")
    return zone


def hwmon(root: Path, n: int, name: str, **files: int) -> Path:
    mon = root / f"sys/class/hwmon/hwmon{n}"
    write(mon / "name", name + "\n")
    for key, value in files.items():
        write(mon / key, f"{value}\n")
    return mon


def battery(root: Path, status: str, **files: int) -> Path:
    bat = root / "sys/class/power_supply/BAT0"
    write(bat / "status", status + "\n")
    for key, value in files.items():
        write(bat / key, f"{value}\n")
    return bat


class FakeNvml:
    """The part of pynvml the probes use; energy in mJ, power in mW."""

    class NVMLError(Exception):
        pass

    def __init__(
        self, *, energy_mj: int | None = 1000, power_mw: int = 50_000, fail_init: bool = False
    ):
        self.energy_mj = energy_mj
        self.power_mw = power_mw
        self.fail_init = fail_init
        self.gone = False

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        return f"gpu{i}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:  # noqa: N802
        if self.gone:
            raise self.NVMLError("GPU is lost")
        if self.energy_mj is None:
            raise self.NVMLError("Not Supported")
        return self.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:  # noqa: N802
        if self.gone:
            raise self.NVMLError("GPU is lost")
        return self.power_mw


def no_nvml() -> None:
    return None


def test_rapl_counter_and_wrap_around(tmp_path: Path) -> None:
    zone = rapl_zone(tmp_path, 0, "package-0", 999_000_000, 1_000_000_000)
    found = survey(tmp_path, find_nvml=no_nvml)
    assert [p.name for p in found.probes] == ["rapl:package-0"]
    probe = found.probes[0]
    assert (probe.covers, probe.method) == ("cpu-package", "counter")
    meter = EnergyMeter(found.probes)
    with meter.measure() as m:
        # The counter passes its maximum (1000 J) and starts again from 0: 1 J + 2.5 J.
        write(zone / "energy_uj", "2500000\n")
    assert m.energy.joules == pytest.approx(3.5)
    assert m.energy.source == "rapl:package-0"
    assert m.energy.tokens_per_joule(7) == pytest.approx(2.0)


def test_rapl_without_wrap_and_two_packages_add_up(tmp_path: Path) -> None:
    a = rapl_zone(tmp_path, 0, "package-0", 1_000_000, 262_143_328_850)
    b = rapl_zone(tmp_path, 1, "package-1", 0, 262_143_328_850)
    with EnergyMeter(survey(tmp_path, find_nvml=no_nvml).probes).measure() as m:
        write(a / "energy_uj", "3000000")
        write(b / "energy_uj", "500000")
    assert m.energy.joules == pytest.approx(2.5)
    assert m.energy.source == "rapl:package-0+rapl:package-1"


def as_non_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root reads files whatever their mode: make reads honour the mode as for a user."""
    if os.geteuid() != 0:
        return
    real = Path.read_text

    def read_text(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.exists() and not self.stat().st_mode & 0o444:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)


def test_unreadable_rapl_is_a_finding_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zone = rapl_zone(tmp_path, 0, "package-0", 10, 100)
    (zone / "energy_uj").chmod(0o200)  # as the kernel ships it since Linux 5.10 (root: 0400)
    as_non_root(monkeypatch)
    found = survey(tmp_path, find_nvml=no_nvml)
    assert found.probes == []
    finding = next(f for f in found.findings if f.source == "rapl:package-0")
    assert not finding.ok
    assert "permission denied" in finding.detail
    assert "chmod o+r" in finding.fix and "energy_uj" in finding.fix


def test_missing_files_and_garbage_are_findings_not_errors(tmp_path: Path) -> None:
    zone = tmp_path / "sys/class/powercap/intel-rapl:0"
    write(zone / "name", "package-0")
    write(zone / "energy_uj", "12")  # no max_energy_range_uj
    hwmon(tmp_path, 0, "amdgpu")  # no energy or power file
    mon = hwmon(tmp_path, 1, "amdgpu")
    write(mon / "power1_average", "n/a")
    found = survey(tmp_path, find_nvml=no_nvml)
    assert found.probes == []
    details = {f.source: f.detail for f in found.findings}
    assert "max_energy_range_uj" in details["rapl:package-0"]
    assert "no energy or power file" in details["amdgpu:hwmon0"]
    assert "not a number" in details["amdgpu:hwmon1"]
    assert "nvidia-ml-py is not installed" in details["nvml"]


def test_amdgpu_energy_counter_preferred_over_power(tmp_path: Path) -> None:
    mon = hwmon(tmp_path, 2, "amdgpu", energy1_input=4_000_000, power1_average=20_000_000)
    hwmon(tmp_path, 3, "k10temp", temp1_input=40000)
    found = survey(tmp_path, find_nvml=no_nvml)
    assert [(p.name, p.covers, p.method) for p in found.probes] == [
        ("amdgpu:hwmon2", "gpu-board", "counter")
    ]
    with EnergyMeter(found.probes).measure() as m:
        write(mon / "energy1_input", "10000000")
    assert m.energy.joules == pytest.approx(6.0)


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_amdgpu_sampled_power_is_integrated(tmp_path: Path) -> None:
    """A 780M-style APU reports power1_input only: the sampler integrates it over time."""
    hwmon(tmp_path, 0, "amdgpu", power1_input=15_000_000)  # 15 W
    found = survey(tmp_path, find_nvml=no_nvml)
    probe = found.probes[0]
    assert (probe.method, probe.covers) == ("power", "gpu-board")
    m = EnergyMeter(found.probes, interval=0.01).measure()
    m.begin()
    sampler = m.sampler
    assert sampler is not None
    wait_for(lambda: len(sampler.last) and sampler.joules[probe.name] > 0)
    t0 = sampler.last[probe.name][0]
    result = m.end()
    elapsed = sampler.last[probe.name][0] - sampler.first[probe.name]
    assert t0 >= sampler.first[probe.name]
    assert result.joules == pytest.approx(15.0 * elapsed, rel=1e-6)
    assert not sampler.is_alive()


def test_battery_discharging_covers_the_whole_system(tmp_path: Path) -> None:
    rapl_zone(tmp_path, 0, "package-0", 0, 1 << 32)
    battery(tmp_path, "Discharging", current_now=2_000_000, voltage_now=11_000_000)  # 22 W
    found = survey(tmp_path, find_nvml=no_nvml)
    bat = next(p for p in found.probes if p.name == "battery:BAT0")
    assert (bat.covers, bat.method) == ("system", "power")
    assert bat.read() == pytest.approx(22.0)
    # The whole system includes the package: only the battery is used.
    assert [p.name for p in EnergyMeter(found.probes).probes] == ["battery:BAT0"]


def test_battery_power_now_and_charging(tmp_path: Path) -> None:
    bat = battery(tmp_path, "Charging", power_now=9_000_000)
    found = survey(tmp_path, find_nvml=no_nvml)
    assert found.probes == []
    assert "charging" in next(f.detail for f in found.findings if f.source == "battery:BAT0")
    write(bat / "status", "Discharging")
    found = survey(tmp_path, find_nvml=no_nvml)
    assert found.probes[0].read() == pytest.approx(9.0)


def test_probe_vanishing_mid_reply_leaves_the_figure_out(tmp_path: Path) -> None:
    zone = rapl_zone(tmp_path, 0, "package-0", 100, 1 << 32)
    mon = hwmon(tmp_path, 0, "amdgpu", power1_average=5_000_000)
    found = survey(tmp_path, find_nvml=no_nvml)
    assert len(found.probes) == 2
    m = EnergyMeter(found.probes, interval=0.01).measure()
    m.begin()
    (zone / "energy_uj").unlink()
    (mon / "power1_average").unlink()
    result = m.end()
    assert result.joules is None
    assert "rapl:package-0: vanished mid-reply" in result.note
    assert "amdgpu:hwmon0: vanished mid-reply" in result.note
    assert m.sampler is not None and not m.sampler.is_alive()


def test_fake_nvml_energy_counter(tmp_path: Path) -> None:
    nvml = FakeNvml(energy_mj=1_000)
    found = survey(tmp_path, nvml=nvml)
    assert [(p.name, p.method, p.covers) for p in found.probes] == [
        ("nvml:0", "counter", "gpu-board")
    ]
    with EnergyMeter(found.probes).measure() as m:
        nvml.energy_mj = 13_500
    assert m.energy.joules == pytest.approx(12.5)


def test_fake_nvml_power_only_gpu_is_sampled(tmp_path: Path) -> None:
    nvml = FakeNvml(energy_mj=None, power_mw=40_000)
    found = survey(tmp_path, nvml=nvml)
    assert [(p.name, p.method) for p in found.probes] == [("nvml:0", "power")]
    assert found.probes[0].read() == pytest.approx(40.0)


def test_nvml_failing_or_lost_gpu(tmp_path: Path) -> None:
    found = survey(tmp_path, nvml=FakeNvml(fail_init=True))
    assert found.probes == []
    assert "Driver Not Loaded" in next(f.detail for f in found.findings if f.source == "nvml")
    nvml = FakeNvml()
    found = survey(tmp_path, nvml=nvml)
    m = EnergyMeter(found.probes).measure()
    m.begin()
    nvml.gone = True
    assert m.end().joules is None
    assert "GPU is lost" in m.energy.note
    with pytest.raises(ProbeError):
        found.probes[0].read()


def test_no_source_at_all(tmp_path: Path) -> None:
    with EnergyMeter(survey(tmp_path, find_nvml=no_nvml).probes).measure() as m:
        pass
    assert m.energy.joules is None and "no power source" in m.energy.note
    assert m.sampler is None


def test_what_each_source_covers_is_documented() -> None:
    assert set(energy.WHAT_IT_COVERS) == {"gpu-board", "cpu-package", "system"}


def test_doctor_section_lists_sources_and_fixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rapl_zone(tmp_path, 0, "package-0", 10, 100)
    zone = rapl_zone(tmp_path, 1, "package-1", 10, 100)
    (zone / "energy_uj").chmod(0o200)
    hwmon(tmp_path, 0, "amdgpu", power1_average=3_000_000)
    as_non_root(monkeypatch)
    text = energy.render_findings(survey(tmp_path, find_nvml=no_nvml))
    lines = text.splitlines()
    assert lines[0] == "Power sources (energy per reply)"
    assert "  + amdgpu:hwmon0: the whole GPU board" in text
    assert "sampled power (power1_average)" in text
    assert "  + rapl:package-0: the CPU package" in text and "energy counter" in text
    unreadable = next(line for line in lines if line.startswith("  - rapl:package-1"))
    assert "permission denied" in unreadable and "to enable: since Linux 5.10" in unreadable
    assert "pip install nvidia-ml-py" in text


class BrokenProbe:
    """A probe whose driver misbehaves with an error no probe expects."""

    name = "broken:0"
    covers: energy.Covers = "gpu-board"
    method: energy.Method = "counter"

    def __init__(self) -> None:
        self.calls = 0

    def read(self) -> float:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("driver crashed")
        return 1.0

    def delta(self, start: float, end: float) -> float:
        return end - start


def test_an_unexpected_probe_failure_never_fails_the_reply() -> None:
    with EnergyMeter([BrokenProbe()]).measure() as m:
        pass
    assert m.energy.joules is None and "driver crashed" in m.energy.note


def test_psys_zone_counts_as_the_whole_system(tmp_path: Path) -> None:
    """Intel laptops expose the platform (psys) as a top-level zone that includes the package."""
    rapl_zone(tmp_path, 0, "package-0", 0, 1 << 32)
    psys = rapl_zone(tmp_path, 1, "psys", 0, 1 << 32)
    found = survey(tmp_path, find_nvml=no_nvml)
    meter = EnergyMeter(found.probes)
    assert [(p.name, p.covers) for p in meter.probes] == [("rapl:psys", "system")]
    with meter.measure() as m:
        write(psys / "energy_uj", "7000000")
    assert m.energy.joules == pytest.approx(7.0) and m.energy.source == "rapl:psys"
