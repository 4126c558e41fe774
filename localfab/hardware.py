"""What the machine has: CPU, RAM, GPUs, and what the installed llama-cpp-python can drive.

Each probe takes its source as an argument (a command runner, a sysfs root, a psutil-like module,
the engine's backend-info callable, which front ends pass in: this layer sits below the engine and
never imports it) so tests feed it recorded readings; the parsers are shared by the live
probes and by `machine_from_profile`, which builds a `Machine` from a shipped hardware profile
(`localfab/data/profiles.json`) so a user can plan for a machine they do not have.

Memory is in bytes throughout. Bandwidths are theoretical peaks in GB/s (10^9 bytes/s): the
planner turns them into decode-speed estimates.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from localfab.errors import UsageError
from localfab.units import GiB, MiB

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,memory.used,memory.free,driver_version",
    "--format=csv,noheader,nounits",
]

# PCI device ids of AMD APUs (integrated Radeon graphics that share system RAM), from the Linux
# amdgpu driver's and Mesa's PCI id tables. A device not listed counts as integrated when its
# BIOS carve-out is at most `_IGPU_MAX_CARVEOUT` (no discrete Radeon of the last decade has so
# little VRAM) — this catches APUs newer than the list.
AMD_APU_DEVICE_IDS = frozenset(
    {
        0x15DD,  # Raven Ridge (Vega 8/11)
        0x15D8,  # Picasso
        0x1636,  # Renoir
        0x1638,  # Cezanne
        0x164C,  # Lucienne
        0x15E7,  # Barcelo
        0x163F,  # Van Gogh (Steam Deck)
        0x1681,  # Rembrandt (680M)
        0x164E,  # Raphael (Ryzen 7000 desktop iGPU)
        0x1506,  # Mendocino
        0x15BF,  # Phoenix (780M/760M)
        0x15C8,  # Phoenix 2
        0x150E,  # Strix Point (890M)
        0x1586,  # Strix Halo (8060S)
        0x13C0,  # Granite Ridge
    }
)
_IGPU_MAX_CARVEOUT = 1 * GiB

# Theoretical memory bandwidth (GB/s) of NVIDIA GPUs common on small machines, from NVIDIA's
# spec sheets (bus width × memory data rate). Used when nvidia-smi gives no bandwidth; names
# are matched as substrings, longest first, so "RTX 3060 Laptop" wins over "RTX 3060".
NVIDIA_BANDWIDTH_GBS: Mapping[str, float] = {
    "GTX 1650": 128,
    "GTX 1660 Ti": 288,
    "GTX 1660 SUPER": 336,
    "GTX 1660": 192,
    "RTX 2060": 336,
    "RTX 2070": 448,
    "RTX 3050 Laptop": 192,
    "RTX 3050": 224,
    "RTX 3060 Laptop": 336,
    "RTX 3060": 360,
    "RTX 3070 Laptop": 448,
    "RTX 3070": 448,
    "RTX 4050 Laptop": 192,
    "RTX 4060 Laptop": 256,
    "RTX 4060 Ti": 288,
    "RTX 4060": 272,
    "RTX 4070 Laptop": 256,
    "RTX 4070": 504,
}


@dataclass(frozen=True)
class Cpu:
    """The CPU as llama.cpp uses it: physical cores set the thread count."""

    model: str
    physical_cores: int
    logical_cpus: int
    performance_cores: int | None = None
    bandwidth_gbs: float | None = None
    # llama.cpp repacks Q4_0/Q4_K/IQ4_NL weights for AVX2/NEON kernels into an extra CPU buffer
    # (CPU_REPACK); every x86-64 CPU from 2015 on and every 64-bit ARM does this.
    repack: bool = True


@dataclass(frozen=True)
class Device:
    """One GPU. `total`/`free` are what the backend `kind` can allocate on it.

    For AMD APUs under Vulkan that is the BIOS carve-out plus GTT (system RAM the GPU may map);
    under ROCm only the carve-out. `unified_memory` devices share RAM and bandwidth with the CPU.
    """

    index: int
    name: str
    vendor: str  # "nvidia" | "amd"
    kind: str  # backend that drives it: "cuda" | "vulkan" | "rocm"
    total: int
    used: int
    free: int
    unified_memory: bool = False
    bandwidth_gbs: float | None = None
    driver: str | None = None
    pci_device_id: int | None = None
    vram_total: int | None = None  # AMD: BIOS carve-out / dedicated VRAM
    vram_used: int | None = None
    gtt_total: int | None = None  # AMD: system RAM the GPU can map
    gtt_used: int | None = None

    @property
    def vram_free(self) -> int:
        """Free dedicated memory (carve-out for an APU); everything for NVIDIA."""
        if self.vram_total is None:
            return self.free
        return max(0, self.vram_total - (self.vram_used or 0))

    @property
    def gtt_free(self) -> int:
        """Free GTT this device's backend can use (0 when it cannot use GTT)."""
        return max(0, self.free - self.vram_free)


@dataclass(frozen=True)
class LlamaBackend:
    """What the installed llama-cpp-python was built with."""

    backends: tuple[str, ...]  # e.g. ("CPU",) or ("CPU", "CUDA")
    gpu_offload: bool
    system_info: str = ""
    version: str | None = None
    error: str | None = None  # why it could not be probed

    @property
    def gpu_kinds(self) -> frozenset[str]:
        """Device kinds this build can drive: subset of {"cuda", "vulkan", "rocm", "metal"}."""
        kinds = set()
        for b in self.backends:
            k = b.lower()
            if k in ("hip", "rocm"):
                kinds.add("rocm")
            elif k in ("cuda", "vulkan", "metal", "sycl"):
                kinds.add(k)
        return frozenset(kinds) if self.gpu_offload or kinds else frozenset()

    @property
    def label(self) -> str:
        gpus = [b for b in self.backends if b.upper() != "CPU"]
        return "+".join(gpus) if gpus else "CPU only"


@dataclass(frozen=True)
class Machine:
    """Everything the planner needs to know about the hardware."""

    cpu: Cpu
    ram_total: int
    ram_available: int
    devices: tuple[Device, ...]
    backend: LlamaBackend
    source: str = "probe"  # "probe" or "profile:<name>"
    notes: tuple[str, ...] = field(default=(), compare=False)

    def usable_devices(self) -> tuple[Device, ...]:
        """Devices the installed llama-cpp-python can offload to."""
        kinds = self.backend.gpu_kinds
        return tuple(d for d in self.devices if d.kind in kinds)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "source": self.source,
            "cpu": asdict(self.cpu),
            "ram_total": self.ram_total,
            "ram_available": self.ram_available,
            "devices": [asdict(d) | {"usable": d in self.usable_devices()} for d in self.devices],
            "backend": {
                "backends": list(self.backend.backends),
                "gpu_offload": self.backend.gpu_offload,
                "version": self.backend.version,
                "error": self.backend.error,
            },
            "notes": list(self.notes),
        }


# --- NVIDIA ------------------------------------------------------------------------------------

Runner = Callable[[Sequence[str]], "str | None"]


def run_command(argv: Sequence[str], *, timeout: float = 5.0) -> str | None:
    """Run a probe command; None when it is missing, fails or hangs (no GPU of that kind)."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _mib(text: str) -> int | None:
    text = text.strip()
    try:
        return int(float(text) * MiB)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_nvidia_smi(text: str, *, kind: str = "cuda") -> list[Device]:
    """Parse `nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,
    driver_version --format=csv,noheader,nounits` output (memory in MiB)."""
    devices: list[Device] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6:
            raise UsageError(f"unexpected nvidia-smi line {line!r}: expected 6 fields")
        # the name may itself contain commas: it is everything between index and the numbers
        index, name = parts[0], ", ".join(parts[1:-4])
        total, used, free = (_mib(p) for p in parts[-4:-1])
        if total is None:
            continue
        used = used if used is not None else 0
        free = free if free is not None else max(0, total - used)
        devices.append(
            Device(
                index=int(index) if index.isdigit() else len(devices),
                name=name,
                vendor="nvidia",
                kind=kind,
                total=total,
                used=used,
                free=free,
                unified_memory=False,
                bandwidth_gbs=nvidia_bandwidth(name),
                driver=parts[-1] or None,
            )
        )
    return devices


def nvidia_bandwidth(name: str) -> float | None:
    """Theoretical bandwidth of a known NVIDIA GPU, by name; None if unknown."""
    for key in sorted(NVIDIA_BANDWIDTH_GBS, key=len, reverse=True):
        if key.lower() in name.lower():
            return NVIDIA_BANDWIDTH_GBS[key]
    return None


def probe_nvidia(run: Runner = run_command, *, kind: str = "cuda") -> list[Device]:
    """NVIDIA GPUs through nvidia-smi; empty when it is missing (no NVIDIA driver)."""
    out = run(NVIDIA_SMI_QUERY)
    return parse_nvidia_smi(out, kind=kind) if out else []


# --- AMD ---------------------------------------------------------------------------------------

DRM_FILES = (
    "vendor",
    "device",
    "mem_info_vram_total",
    "mem_info_vram_used",
    "mem_info_gtt_total",
    "mem_info_gtt_used",
)
_CARD_RE = re.compile(r"^card\d+$")


def read_drm(root: str | os.PathLike[str] = "/sys/class/drm") -> dict[str, dict[str, Any]]:
    """Read the amdgpu sysfs files of every cardN under `root`, as the profiles record them."""
    base = Path(root)
    cards: dict[str, dict[str, Any]] = {}
    if not base.is_dir():
        return cards
    for card in sorted(base.iterdir(), key=lambda p: p.name):
        if not _CARD_RE.match(card.name):
            continue  # connectors such as card1-eDP-1
        dev = card / "device"
        values: dict[str, Any] = {}
        for name in DRM_FILES:
            try:
                raw = (dev / name).read_text().strip()
            except OSError:
                continue
            values[name] = int(raw) if raw.isdigit() else raw
        with contextlib.suppress(OSError):
            values["driver"] = os.path.basename(os.readlink(dev / "driver"))
        if values:
            cards[card.name] = values
    return cards


def _as_int(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return None
    return None


def parse_drm(
    drm: Mapping[str, Mapping[str, Any]],
    *,
    kind: str = "vulkan",
    system_bandwidth_gbs: float | None = None,
) -> list[Device]:
    """AMD GPUs from amdgpu sysfs readings ({"card1": {"vendor": "0x1002", ...}}).

    `kind` is the backend that will drive them: "vulkan" can allocate carve-out + GTT, "rocm"
    only the carve-out. Integrated GPUs share the system's memory bandwidth.
    """
    devices: list[Device] = []
    for card, values in sorted(drm.items()):
        if _as_int(values.get("vendor")) != 0x1002:
            continue  # only amdgpu exposes these memory files
        vram_total = _as_int(values.get("mem_info_vram_total"))
        if vram_total is None:
            continue
        vram_used = _as_int(values.get("mem_info_vram_used")) or 0
        gtt_total = _as_int(values.get("mem_info_gtt_total")) or 0
        gtt_used = _as_int(values.get("mem_info_gtt_used")) or 0
        device_id = _as_int(values.get("device"))
        integrated = device_id in AMD_APU_DEVICE_IDS or vram_total <= _IGPU_MAX_CARVEOUT
        vram_free = max(0, vram_total - vram_used)
        if integrated and kind == "vulkan":
            total = vram_total + gtt_total
            used = vram_used + gtt_used
            free = vram_free + max(0, gtt_total - gtt_used)
        else:
            total, used, free = vram_total, vram_used, vram_free
        name = _amd_name(device_id, integrated)
        digits = re.sub(r"\D", "", card)
        devices.append(
            Device(
                index=int(digits) if digits else len(devices),
                name=name,
                vendor="amd",
                kind=kind,
                total=total,
                used=used,
                free=free,
                unified_memory=integrated,
                bandwidth_gbs=system_bandwidth_gbs if integrated else None,
                driver=str(values.get("driver")) if values.get("driver") else None,
                pci_device_id=device_id,
                vram_total=vram_total,
                vram_used=vram_used,
                gtt_total=gtt_total,
                gtt_used=gtt_used,
            )
        )
    return devices


_AMD_NAMES = {
    0x15BF: "AMD Radeon 780M",
    0x15C8: "AMD Radeon 740M",
    0x1681: "AMD Radeon 680M",
    0x150E: "AMD Radeon 890M",
    0x1586: "AMD Radeon 8060S",
    0x163F: "AMD Custom GPU 0405 (Steam Deck)",
}


def _amd_name(device_id: int | None, integrated: bool) -> str:
    if device_id is not None and device_id in _AMD_NAMES:
        return _AMD_NAMES[device_id]
    what = "integrated" if integrated else "discrete"
    return f"AMD Radeon ({what}, device 0x{device_id or 0:04x})"


def probe_amd(
    sysfs_root: str | os.PathLike[str] = "/sys/class/drm",
    *,
    kind: str = "vulkan",
    system_bandwidth_gbs: float | None = None,
) -> list[Device]:
    """AMD GPUs from the amdgpu sysfs files under `sysfs_root`."""
    return parse_drm(read_drm(sysfs_root), kind=kind, system_bandwidth_gbs=system_bandwidth_gbs)


# --- CPU and RAM -------------------------------------------------------------------------------


class PsutilLike(Protocol):
    def cpu_count(self, logical: bool = ...) -> int | None: ...

    def virtual_memory(self) -> Any: ...


def _cpu_model(cpuinfo: Path) -> tuple[str, bool]:
    """CPU model name and whether llama.cpp's repacked kernels apply (AVX2 or ARM64)."""
    import platform

    model, repack = platform.processor() or platform.machine() or "unknown CPU", True
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return model, repack
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    if m:
        model = m.group(1).strip()
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.MULTILINE)
    if flags:
        repack = "avx2" in flags.group(1).split()
    return model, repack


def probe_cpu(
    psutil_module: PsutilLike | None = None,
    *,
    cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo",
    bandwidth_gbs: float | None = None,
) -> tuple[Cpu, int, int]:
    """The CPU and (total, available) RAM in bytes, via psutil."""
    if psutil_module is None:
        import psutil

        psutil_module = psutil
    logical = psutil_module.cpu_count(logical=True) or 1
    physical = psutil_module.cpu_count(logical=False) or logical
    vm = psutil_module.virtual_memory()
    model, repack = _cpu_model(Path(cpuinfo))
    cpu = Cpu(
        model=model,
        physical_cores=physical,
        logical_cpus=logical,
        bandwidth_gbs=bandwidth_gbs,
        repack=repack,
    )
    return cpu, int(vm.total), int(vm.available)


# --- the installed llama-cpp-python ------------------------------------------------------------


BackendInfo = Callable[[], Mapping[str, Any]]

# Why a machine probed without `backend_info` counts as CPU-only.
NOT_ASKED = "no backend_info was given to the probe, so only the CPU is planned for"


def parse_backend_info(info: Mapping[str, Any]) -> LlamaBackend:
    """Turn the engine's `backend_info()` dict into a `LlamaBackend`."""
    backends = tuple(str(b) for b in info.get("backends", ("CPU",)))
    if "CPU" not in {b.upper() for b in backends}:
        backends = ("CPU", *backends)
    return LlamaBackend(
        backends=backends,
        gpu_offload=bool(info.get("gpu_offload", len(backends) > 1)),
        system_info=str(info.get("system_info", "")),
        version=str(info["version"]) if info.get("version") else None,
    )


def probe_backend(info: BackendInfo | None) -> LlamaBackend:
    """Which GPU backends the installed llama-cpp-python was built with.

    `info` is the engine's `backend_info` (the front end passes it: this layer sits below the
    engine and never imports it). None, or a callable that fails, gives a CPU-only backend
    whose `error` says why, which the plan shows as a warning.
    """
    if info is None:
        return LlamaBackend(backends=("CPU",), gpu_offload=False, error=NOT_ASKED)
    try:
        raw = info()
    except Exception as exc:  # a broken or missing build must not stop planning
        return LlamaBackend(
            backends=("CPU",), gpu_offload=False, error=f"{type(exc).__name__}: {exc}"
        )
    return parse_backend_info(raw)


# --- the whole machine -------------------------------------------------------------------------


def _kind_for(vendor: str, backend: LlamaBackend) -> str:
    """The backend kind a device of `vendor` would use with this build (or natively, if none)."""
    kinds = backend.gpu_kinds
    if vendor == "nvidia":
        return "cuda" if "cuda" in kinds or "vulkan" not in kinds else "vulkan"
    return "rocm" if "rocm" in kinds and "vulkan" not in kinds else "vulkan"


def probe_machine(
    *,
    run: Runner = run_command,
    sysfs_root: str | os.PathLike[str] = "/sys/class/drm",
    psutil_module: PsutilLike | None = None,
    cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo",
    backend_info: BackendInfo | None = None,
) -> Machine:
    """Probe this machine: CPU, RAM, NVIDIA and AMD GPUs and the llama-cpp-python build.

    Front ends pass the engine's `backend_info` (see `probe_backend`); without it the machine
    is planned as CPU-only, with a warning.
    """
    backend = probe_backend(backend_info)
    cpu, ram_total, ram_available = probe_cpu(psutil_module, cpuinfo=cpuinfo)
    devices = probe_nvidia(run, kind=_kind_for("nvidia", backend))
    devices += probe_amd(sysfs_root, kind=_kind_for("amd", backend))
    return Machine(
        cpu=cpu,
        ram_total=ram_total,
        ram_available=ram_available,
        devices=tuple(devices),
        backend=backend,
        source="probe",
    )


# --- shipped hardware profiles -----------------------------------------------------------------


def _data_json(name: str) -> dict[str, Any]:
    text = resources.files("localfab").joinpath("data", name).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def load_profiles() -> dict[str, dict[str, Any]]:
    """The hardware profiles shipped with localfab, by name."""
    profiles: dict[str, dict[str, Any]] = _data_json("profiles.json")["profiles"]
    return profiles


def load_model_specs() -> dict[str, dict[str, Any]]:
    """Architecture facts of models people run on small machines (for planning without a file)."""
    models: dict[str, dict[str, Any]] = _data_json("models.json")["models"]
    return models


def machine_from_profile(profile: Mapping[str, Any], *, name: str = "custom") -> Machine:
    """A `Machine` from a profile entry, parsed by the same code as the live probes."""
    backend_name = str(profile.get("llama_backend", "CPU"))
    gpu = backend_name.upper() != "CPU"
    backend = LlamaBackend(
        backends=("CPU", backend_name) if gpu else ("CPU",),
        gpu_offload=gpu,
        system_info=f"profile {name}",
    )
    c = profile.get("cpu", {})
    cpu = Cpu(
        model=str(c.get("model", "unknown CPU")),
        physical_cores=int(c.get("physical_cores", 1)),
        logical_cpus=int(c.get("logical_cpus", c.get("physical_cores", 1))),
        performance_cores=c.get("performance_cores"),
        bandwidth_gbs=c.get("bandwidth_gbs"),
    )
    devices: list[Device] = []
    notes: list[str] = []
    if "nvidia_smi" in profile:
        found = parse_nvidia_smi(profile["nvidia_smi"], kind=_kind_for("nvidia", backend))
        bw = profile.get("gpu_bandwidth_gbs")
        devices += [d if bw is None else _replace(d, bandwidth_gbs=float(bw)) for d in found]
    if "drm" in profile:
        devices += parse_drm(
            profile["drm"], kind=_kind_for("amd", backend), system_bandwidth_gbs=cpu.bandwidth_gbs
        )
    if profile.get("_note"):
        notes.append(str(profile["_note"]))
    ram = profile.get("ram", {})
    return Machine(
        cpu=cpu,
        ram_total=int(ram.get("total", 0)),
        ram_available=int(ram.get("available", ram.get("total", 0))),
        devices=tuple(devices),
        backend=backend,
        source=f"profile:{name}",
        notes=tuple(notes),
    )


def machine_from_profile_name(name: str) -> Machine:
    """A shipped profile by name; `UsageError` listing the names if it is unknown."""
    profiles = load_profiles()
    if name not in profiles:
        raise UsageError(f"unknown hardware profile {name!r}; known: {', '.join(profiles)}")
    return machine_from_profile(profiles[name], name=name)


def _replace(device: Device, **changes: Any) -> Device:
    from dataclasses import replace

    return replace(device, **changes)
