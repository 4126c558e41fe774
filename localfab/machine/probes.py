"""What the machine has: CPU, RAM, GPUs, and what the installed llama-cpp-python can drive.

Each probe takes its source as an argument (a command runner, a sysfs root, a psutil-like module,
the engine's backend-info callable, which front ends pass in: this layer sits below the engine and
never imports it) so tests feed it recorded readings; the parsers are shared by the live
probes and by `machine_from_profile`, which builds a `Machine` from a shipped hardware profile
(`localfab/data/profiles.json`) so a user can plan for a machine they do not have.

Memory is in bytes throughout. Bandwidths are theoretical peaks in GB/s (10^9 bytes/s): the
planner turns them into decode-speed estimates.

The types are in `hardware_types`, the GPU probes and parsers in `hardware_gpus`; this module
probes the CPU, RAM and llama-cpp-python build, puts a `Machine` together and reads the shipped
profiles. Everything keeps its import path here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from localfab.errors import UsageError
from localfab.machine.gpus import (
    AMD_APU_DEVICE_IDS,
    DRM_FILES,
    NVIDIA_BANDWIDTH_GBS,
    NVIDIA_SMI_QUERY,
    Runner,
    nvidia_bandwidth,
    parse_drm,
    parse_nvidia_smi,
    probe_amd,
    probe_nvidia,
    read_drm,
    run_command,
)
from localfab.machine.types import Cpu, Device, LlamaBackend, Machine
from localfab.units import GiB, MiB

__all__ = [
    "AMD_APU_DEVICE_IDS",
    "DRM_FILES",
    "NOT_ASKED",
    "NVIDIA_BANDWIDTH_GBS",
    "NVIDIA_SMI_QUERY",
    "BackendInfo",
    "Cpu",
    "Device",
    "GiB",
    "LlamaBackend",
    "Machine",
    "MiB",
    "PsutilLike",
    "Runner",
    "load_model_specs",
    "load_profiles",
    "machine_from_profile",
    "machine_from_profile_name",
    "nvidia_bandwidth",
    "parse_backend_info",
    "parse_drm",
    "parse_nvidia_smi",
    "probe_amd",
    "probe_backend",
    "probe_cpu",
    "probe_machine",
    "probe_nvidia",
    "read_drm",
    "run_command",
]


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


def cpu_for_build(cpu: Cpu, backend: LlamaBackend) -> Cpu:
    """The CPU as this llama.cpp build uses it: a build with AMX kernels repacks nothing."""
    return replace(cpu, repack=False) if cpu.repack and backend.amx else cpu


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
    cpu = cpu_for_build(cpu, backend)
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
