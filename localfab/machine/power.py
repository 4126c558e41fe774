"""Power sources: the probes, what each covers and how it measures, and the machine's survey.

Each probe reads one power source and says what it covers (a GPU board, the CPU package, or the
whole system) and how it measures (an energy counter read at the start and end of a generation,
or sampled power integrated by a background thread). Probes take their source as an argument (a
sysfs root, an NVML-like module) so tests feed them fake trees; nothing here imports the engine.

A probe that is missing, unreadable or vanishes mid-reply never fails a reply: the figure is left
out and the reason is kept for `localfab doctor` and `localfab stats`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

Covers = Literal["gpu-board", "cpu-package", "system"]
Method = Literal["counter", "power"]

WHAT_IT_COVERS: dict[str, str] = {
    "gpu-board": "the whole GPU board (chip and its memory), not the CPU or the rest",
    "cpu-package": "the CPU package (cores, caches, and the iGPU on an APU), not RAM or GPUs",
    "system": "the whole laptop, screen included, read from the battery while it discharges",
}

# How often power-only sources are sampled, in seconds: often enough for replies of a second,
# rarely enough that the thread never shows in the decode speed.
SAMPLE_INTERVAL_S = 0.1


class ProbeError(Exception):
    """A probe could not be read (missing, unreadable, or gone); the message says which file."""


class Probe(Protocol):
    """One power source. `read()` gives joules for a counter, watts for a power source."""

    @property
    def name(self) -> str: ...

    @property
    def covers(self) -> Covers: ...

    @property
    def method(self) -> Method: ...

    def read(self) -> float: ...

    def delta(self, start: float, end: float) -> float:
        """Joules between two counter readings (counters may wrap)."""
        ...


def _read_number(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except PermissionError as exc:
        raise ProbeError(f"{path} is not readable (permission denied)") from exc
    except OSError as exc:
        raise ProbeError(f"{path} cannot be read ({exc.strerror or exc})") from exc
    try:
        return int(text)
    except ValueError as exc:
        raise ProbeError(f"{path} holds {text!r}, not a number") from exc


@dataclass(frozen=True)
class RaplProbe:
    """A RAPL powercap zone (Intel, and AMD Zen through the same interface): `energy_uj`.

    The counter wraps at `max_energy_range_uj`; a delta across one wrap is still right (a reply
    long enough to wrap twice would need minutes at full power on the smallest counters).
    """

    zone: Path
    label: str
    max_range_uj: int
    covers: Covers = "cpu-package"
    method: Method = "counter"

    @property
    def name(self) -> str:
        return f"rapl:{self.label}"

    def read(self) -> float:
        return float(_read_number(self.zone / "energy_uj"))

    def delta(self, start: float, end: float) -> float:
        diff = end - start
        if diff < 0:
            diff += self.max_range_uj
        return diff / 1e6


@dataclass(frozen=True)
class HwmonProbe:
    """An amdgpu hwmon sensor: `energy1_input` (µJ counter) or `power1_average`/`power1_input`."""

    file: Path
    label: str
    method: Method
    covers: Covers = "gpu-board"

    @property
    def name(self) -> str:
        return f"amdgpu:{self.label}"

    def read(self) -> float:
        value = _read_number(self.file)
        return value / 1e6  # µJ -> J, or µW -> W

    def delta(self, start: float, end: float) -> float:
        return max(0.0, end - start)


@dataclass(frozen=True)
class BatteryProbe:
    """A laptop battery while discharging: `power_now`, or `current_now` × `voltage_now`."""

    supply: Path
    covers: Covers = "system"
    method: Method = "power"

    @property
    def name(self) -> str:
        return f"battery:{self.supply.name}"

    def read(self) -> float:
        status = self.supply / "status"
        try:
            state = status.read_text().strip()
        except OSError as exc:
            raise ProbeError(f"{status} cannot be read ({exc})") from exc
        if state != "Discharging":
            raise ProbeError(f"{self.supply.name} is {state.lower() or 'in an unknown state'}")
        if (self.supply / "power_now").exists():
            return _read_number(self.supply / "power_now") / 1e6
        current = _read_number(self.supply / "current_now")
        voltage = _read_number(self.supply / "voltage_now")
        return current * voltage / 1e12

    def delta(self, start: float, end: float) -> float:
        return max(0.0, end - start)


@dataclass
class NvmlProbe:
    """An NVIDIA GPU through NVML: the total energy counter (mJ) where the GPU has one (Volta and
    newer), sampled board power (mW) otherwise."""

    nvml: Any
    handle: Any
    index: int
    method: Method
    covers: Covers = "gpu-board"

    @property
    def name(self) -> str:
        return f"nvml:{self.index}"

    def read(self) -> float:
        try:
            if self.method == "counter":
                return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)) / 1e3
            return float(self.nvml.nvmlDeviceGetPowerUsage(self.handle)) / 1e3
        except Exception as exc:  # NVMLError and its many subclasses
            raise ProbeError(f"NVML GPU {self.index}: {exc}") from exc

    def delta(self, start: float, end: float) -> float:
        return max(0.0, end - start)


@dataclass(frozen=True)
class Finding:
    """What `doctor` says about a power source: found, or missing and how to enable it."""

    source: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class Survey:
    """The probes that work on this machine, and what was found about the rest."""

    probes: list[Probe] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


RAPL_FIX = (
    "since Linux 5.10 energy_uj is readable by root only; allow it with "
    "`sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj` (until reboot) or a udev rule: "
    'SUBSYSTEM=="powercap", ACTION=="add", RUN+="/bin/chmod o+r /sys%p/energy_uj"'
)


def _probe_rapl(root: Path, survey: Survey) -> None:
    base = root / "sys/class/powercap"
    zones = sorted(base.glob("intel-rapl:*")) if base.is_dir() else []
    # Top-level zones only (intel-rapl:0, not intel-rapl:0:0): sub-zones are inside them.
    zones = [z for z in zones if z.name.count(":") == 1]
    if not zones:
        survey.findings.append(
            Finding("rapl", False, "no RAPL powercap zones", "load the intel_rapl_msr module")
        )
        return
    for zone in zones:
        try:
            label = (zone / "name").read_text().strip() or zone.name
        except OSError:
            label = zone.name
        try:
            max_range = _read_number(zone / "max_energy_range_uj")
            probe = RaplProbe(zone=zone, label=label, max_range_uj=max_range)
            probe.read()
        except ProbeError as exc:
            survey.findings.append(Finding(f"rapl:{label}", False, str(exc), RAPL_FIX))
            continue
        if label == "psys":
            # psys is the whole platform on Intel laptops: it includes the package zone.
            probe = RaplProbe(zone=zone, label=label, max_range_uj=max_range, covers="system")
        survey.probes.append(probe)
        survey.findings.append(
            Finding(probe.name, True, f"{WHAT_IT_COVERS[probe.covers]}; energy counter")
        )


def _probe_hwmon(root: Path, survey: Survey) -> None:
    base = root / "sys/class/hwmon"
    for mon in sorted(base.glob("hwmon*")) if base.is_dir() else []:
        try:
            if (mon / "name").read_text().strip() != "amdgpu":
                continue
        except OSError:
            continue
        candidates: list[tuple[Path, Method]] = [
            *((f, "counter") for f in sorted(mon.glob("energy*_input"))),
            (mon / "power1_average", "power"),
            (mon / "power1_input", "power"),
        ]
        reasons = []
        for path, method in candidates:
            if not path.exists():
                continue
            probe = HwmonProbe(file=path, label=mon.name, method=method)
            try:
                probe.read()
            except ProbeError as exc:
                reasons.append(str(exc))
                continue
            how = "energy counter" if method == "counter" else f"sampled power ({path.name})"
            survey.probes.append(probe)
            survey.findings.append(
                Finding(probe.name, True, f"{WHAT_IT_COVERS['gpu-board']}; {how}")
            )
            break
        else:
            detail = "; ".join(reasons) or f"{mon} has no energy or power file"
            survey.findings.append(
                Finding(f"amdgpu:{mon.name}", False, detail, "update the kernel's amdgpu driver")
            )


def _probe_battery(root: Path, survey: Survey) -> None:
    base = root / "sys/class/power_supply"
    for supply in sorted(base.glob("BAT*")) if base.is_dir() else []:
        probe = BatteryProbe(supply=supply)
        try:
            probe.read()
        except ProbeError as exc:
            survey.findings.append(
                Finding(probe.name, False, str(exc), "read only while on battery power")
            )
            continue
        survey.probes.append(probe)
        survey.findings.append(Finding(probe.name, True, f"{WHAT_IT_COVERS['system']}"))


def load_nvml() -> Any | None:
    """The `pynvml` module (package nvidia-ml-py) if it is installed, else None."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _probe_nvml(nvml: Any, survey: Survey) -> None:
    try:
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        survey.findings.append(
            Finding("nvml", False, f"NVML failed: {exc}", "check the NVIDIA driver (nvidia-smi)")
        )
        return
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            survey.findings.append(Finding(f"nvml:{index}", False, f"NVML failed: {exc}"))
            continue
        for method in ("counter", "power"):
            probe = NvmlProbe(nvml=nvml, handle=handle, index=index, method=method)
            try:
                probe.read()
            except ProbeError:
                continue
            how = "energy counter" if method == "counter" else "sampled power"
            survey.probes.append(probe)
            survey.findings.append(
                Finding(probe.name, True, f"{WHAT_IT_COVERS['gpu-board']}; {how}")
            )
            break
        else:
            survey.findings.append(
                Finding(f"nvml:{index}", False, "NVML reads neither energy nor power for this GPU")
            )


def survey(
    root: str | Path = "/",
    *,
    nvml: Any | None = None,
    find_nvml: Callable[[], Any | None] = load_nvml,
) -> Survey:
    """Every power source under `root` (a real or fake filesystem root) and NVML if present.

    `nvml` is an NVML-like module (tests pass a fake); by default `pynvml` is imported if it is
    installed. A missing NVML is a finding, never an error.
    """
    found = Survey()
    base = Path(root)
    module = nvml if nvml is not None else find_nvml()
    if module is None:
        found.findings.append(
            Finding(
                "nvml",
                False,
                "nvidia-ml-py is not installed",
                "for NVIDIA GPUs: pip install nvidia-ml-py",
            )
        )
    else:
        _probe_nvml(module, found)
    _probe_hwmon(base, found)
    _probe_rapl(base, found)
    _probe_battery(base, found)
    return found


def choose(probes: Sequence[Probe]) -> list[Probe]:
    """The probes to measure a generation with: the whole system (battery) when it is read,
    else every GPU board and CPU package (they do not overlap)."""
    system = [p for p in probes if p.covers == "system"]
    return system[:1] if system else list(probes)


def render_findings(found: Survey) -> str:
    """`doctor`'s power section: each source, what it covers, and how to enable a missing one."""
    ok = [f for f in found.findings if f.ok]
    lines = ["Power sources (energy per reply)" if ok else "Power sources: none readable"]
    lines += [f"  + {f.source}: {f.detail}" for f in ok]
    for f in found.findings:
        if not f.ok:
            fix = f"; to enable: {f.fix}" if f.fix else ""
            lines.append(f"  - {f.source}: {f.detail}{fix}")
    return "\n".join(lines)
