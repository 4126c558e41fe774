"""The machine as the planner sees it: `Cpu`, `Device` (one GPU), `LlamaBackend` and `Machine`.

Plain frozen dataclasses, shared by the live probes (`hardware`, `hardware_gpus`) and the shipped
hardware profiles. Memory is in bytes; bandwidths are theoretical peaks in GB/s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


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


def amx_in(system_info: str) -> bool:
    """Whether llama.cpp's system info says it was compiled with its AMX kernels."""
    return re.search(r"\bAMX_INT8 = 1\b", system_info) is not None


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
    def amx(self) -> bool:
        """Built with llama.cpp's AMX kernels, which this version gets wrong: the engine then
        loads without extra buffer types, so the weights are not repacked either."""
        return amx_in(self.system_info)

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
