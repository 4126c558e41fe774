"""GPUs: NVIDIA cards through `nvidia-smi`, AMD ones through the amdgpu sysfs files.

Each probe takes its source as an argument (a command runner, a sysfs root) and hands it to a
parser that `hardware.machine_from_profile` shares, so a shipped profile and a live machine are
read by the same code. Memory is in bytes; bandwidths are theoretical peaks in GB/s.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from localfab.errors import UsageError
from localfab.machine.types import Device
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
