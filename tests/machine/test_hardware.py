"""Hardware probes: every shipped profile, and the live probes on recorded readings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from localfab.errors import UsageError
from localfab.machine import probes as hardware
from localfab.machine.probes import (
    GiB,
    MiB,
    machine_from_profile,
    machine_from_profile_name,
    parse_drm,
    parse_nvidia_smi,
    probe_backend,
    probe_machine,
    read_drm,
)

# name -> (device name, vendor, kind, total, free, unified, usable, bandwidth) or None (no GPU)
EXPECTED = {
    "rtx3060-laptop-6gb": (
        "NVIDIA GeForce RTX 3060 Laptop GPU", "nvidia", "cuda", 6144 * MiB, 5596 * MiB,
        False, True, 336,
    ),
    "rtx2060-6gb": (
        "NVIDIA GeForce RTX 2060", "nvidia", "cuda", 6144 * MiB, 5770 * MiB, False, True, 336,
    ),
    "gtx1660ti-laptop-6gb": (
        "NVIDIA GeForce GTX 1660 Ti", "nvidia", "cuda", 6144 * MiB, 5491 * MiB, False, True, 288,
    ),
    # Vulkan on an APU: carve-out + GTT
    "radeon-780m-512mb": (
        "AMD Radeon 780M", "amd", "vulkan", 512 * MiB + 15 * GiB,
        512 * MiB - 150 * MiB + 15 * GiB - 100 * MiB, True, True, 102.4,
    ),
    "radeon-780m-8gb": (
        "AMD Radeon 780M", "amd", "vulkan", 8 * GiB + 12 * GiB,
        8 * GiB - 300 * MiB + 12 * GiB - 50 * MiB, True, True, 89.6,
    ),
    "cpu-only-16gb": None,
    # the GPU is there, the CPU-only build cannot use it
    "cuda-build-on-780m": (
        "AMD Radeon 780M", "amd", "vulkan", 512 * MiB + 15 * GiB,
        512 * MiB - 150 * MiB + 15 * GiB - 100 * MiB, True, False, 102.4,
    ),
}  # fmt: skip


def test_every_profile_is_covered() -> None:
    assert set(hardware.load_profiles()) == set(EXPECTED)


def test_profiles_are_read_from_the_package_data() -> None:
    shipped = Path(hardware.__file__).parent.parent / "data" / "profiles.json"
    assert hardware.load_profiles() == json.loads(shipped.read_text(encoding="utf-8"))["profiles"]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_profile_parses_to_the_right_devices(name: str) -> None:
    profile = hardware.load_profiles()[name]
    machine = machine_from_profile_name(name)
    assert machine.source == f"profile:{name}"
    assert machine.ram_total == profile["ram"]["total"]
    assert machine.ram_available == profile["ram"]["available"]
    assert machine.cpu.physical_cores == profile["cpu"]["physical_cores"]
    assert machine.backend.label == (
        "CPU only" if profile["llama_backend"] == "CPU" else profile["llama_backend"]
    )
    expected = EXPECTED[name]
    if expected is None:
        assert machine.devices == ()
        return
    dev_name, vendor, kind, total, free, unified, usable, bandwidth = expected
    (device,) = machine.devices
    assert (device.name, device.vendor, device.kind) == (dev_name, vendor, kind)
    assert (device.total, device.free, device.unified_memory) == (total, free, unified)
    assert device.unified_memory == profile.get("unified_memory", False)
    assert device.bandwidth_gbs == pytest.approx(bandwidth)
    assert (device in machine.usable_devices()) is usable
    if vendor == "amd":
        card = next(iter(profile["drm"].values()))
        assert device.vram_total == card["mem_info_vram_total"]
        assert device.vram_free == card["mem_info_vram_total"] - card["mem_info_vram_used"]
        assert device.gtt_free == card["mem_info_gtt_total"] - card["mem_info_gtt_used"]


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(UsageError, match="rtx3060-laptop-6gb"):
        machine_from_profile_name("nope")


def test_nvidia_smi_parsing_edge_cases() -> None:
    text = (
        "0, NVIDIA GeForce RTX 4060 Laptop GPU, 8188, 5, 7938, 560.35.03\n"
        "1, Tesla T4, Rev. B, 15360, [N/A], [N/A], 535.1\n"
        "\n"
    )
    a, b = parse_nvidia_smi(text)
    assert (a.index, a.name, a.free, a.bandwidth_gbs) == (0, a.name, 7938 * MiB, 256)
    assert b.name == "Tesla T4, Rev. B" and b.used == 0 and b.free == b.total == 15360 * MiB
    assert b.bandwidth_gbs is None
    with pytest.raises(UsageError):
        parse_nvidia_smi("garbage")


def test_amd_discrete_card_uses_its_vram_only() -> None:
    drm = {
        "card0": {
            "vendor": "0x1002",
            "device": "0x73ff",  # RX 6600: discrete
            "mem_info_vram_total": 8 * GiB,
            "mem_info_vram_used": 1 * GiB,
            "mem_info_gtt_total": 16 * GiB,
            "mem_info_gtt_used": 0,
        },
        "card1": {"vendor": "0x8086", "device": "0x46a6"},  # Intel iGPU: no amdgpu files
    }
    (d,) = parse_drm(drm, system_bandwidth_gbs=50)
    assert not d.unified_memory and d.total == 8 * GiB and d.free == 7 * GiB
    assert d.bandwidth_gbs is None  # unknown, not the system RAM's
    # an APU missing from the id list is still recognised by its small carve-out
    apu = dict(drm["card0"], device="0x9999", mem_info_vram_total=512 * MiB, mem_info_vram_used=0)
    (d,) = parse_drm({"card2": apu}, system_bandwidth_gbs=50)
    assert d.unified_memory and d.total == 512 * MiB + 16 * GiB and d.bandwidth_gbs == 50
    (rocm,) = parse_drm({"card2": apu}, kind="rocm")
    assert rocm.total == rocm.free == 512 * MiB  # ROCm sees only the carve-out


def _fake_sysfs(root: Path, profile_drm: dict) -> Path:
    for card, values in profile_drm.items():
        dev = root / card / "device"
        dev.mkdir(parents=True)
        for key, value in values.items():
            if key != "driver":
                (dev / key).write_text(f"{value}\n")
        (root / f"{card}-eDP-1").mkdir()  # a connector, not a card
    return root


def test_live_probes_on_recorded_readings(tmp_path: Path) -> None:
    profile = hardware.load_profiles()["radeon-780m-512mb"]
    root = _fake_sysfs(tmp_path / "drm", profile["drm"])
    assert read_drm(root)["card1"]["mem_info_gtt_total"] == 16106127360
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: AMD Ryzen 7 7840U\nflags\t\t: fpu sse avx2 fma\n")
    psutil_like = SimpleNamespace(
        cpu_count=lambda logical=True: 16 if logical else 8,
        virtual_memory=lambda: SimpleNamespace(total=32 * GiB, available=24 * GiB),
    )
    calls: list[list[str]] = []

    def no_nvidia(argv: list[str]) -> str | None:
        calls.append(list(argv))
        return None

    machine = probe_machine(
        run=no_nvidia,
        sysfs_root=root,
        psutil_module=psutil_like,
        cpuinfo=cpuinfo,
        backend_info=lambda: {"gpu_offload": True, "backends": ["CPU", "Vulkan"], "version": "x"},
    )
    assert calls and calls[0][0] == "nvidia-smi"
    assert machine.cpu.model == "AMD Ryzen 7 7840U" and machine.cpu.physical_cores == 8
    assert machine.cpu.repack
    assert machine.ram_available == 24 * GiB
    from_profile = machine_from_profile(profile, name="x")
    (live,), (recorded,) = machine.devices, from_profile.devices
    assert (live.name, live.total, live.free, live.kind) == (
        recorded.name,
        recorded.total,
        recorded.free,
        recorded.kind,
    )
    assert machine.usable_devices() == machine.devices

    nvidia = probe_machine(
        run=lambda argv: hardware.load_profiles()["rtx2060-6gb"]["nvidia_smi"] + "\n",
        sysfs_root=tmp_path / "missing",
        psutil_module=psutil_like,
        cpuinfo=cpuinfo,
        backend_info=lambda: {"gpu_offload": False, "backends": ["CPU"]},
    )
    (gpu,) = nvidia.devices
    assert gpu.name == "NVIDIA GeForce RTX 2060" and gpu.bandwidth_gbs == 336
    assert nvidia.usable_devices() == ()  # CPU-only build


def test_backend_probe_survives_a_broken_build() -> None:
    def broken() -> dict:
        raise OSError("libllama.so: cannot open shared object file")

    backend = probe_backend(broken)
    assert backend.backends == ("CPU",) and not backend.gpu_offload
    assert backend.error and "libllama.so" in backend.error
    hip = probe_backend(lambda: {"gpu_offload": True, "backends": ["CPU", "Hip"]})
    assert hip.gpu_kinds == {"rocm"}


def test_a_build_with_amx_kernels_is_planned_without_repacked_weights(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: avx2 amx_tile\n")
    psutil_like = SimpleNamespace(
        cpu_count=lambda logical=True: 2,
        virtual_memory=lambda: SimpleNamespace(total=32 * GiB, available=24 * GiB),
    )
    report = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | {} | LLAMAFILE = 1 | REPACK = 1 | "

    def machine(amx: str) -> hardware.Machine:
        return probe_machine(
            run=lambda argv: None,
            sysfs_root=tmp_path / "none",
            psutil_module=psutil_like,
            cpuinfo=cpuinfo,
            backend_info=lambda: {"backends": ["CPU"], "system_info": report.format(amx)},
        )

    assert machine("AMX_INT8 = 1").backend.amx
    assert not machine("AMX_INT8 = 1").cpu.repack  # the engine loads without extra buffers
    assert machine("AVX512_VNNI = 1").cpu.repack and not machine("AVX512_VNNI = 1").backend.amx


def test_run_command_reports_missing_tools_as_none() -> None:
    assert hardware.run_command(["definitely-not-a-command-xyz"]) is None


def test_live_probe_on_this_machine_with_the_engines_backend_info() -> None:
    from localfab.engine import backend_info

    # the front end hands the engine's probe to the hardware layer, which never imports it
    machine = probe_machine(backend_info=backend_info)
    assert machine.backend.error is None
    assert "CPU" in machine.backend.backends
    assert machine.cpu.physical_cores >= 1 and machine.ram_available > 0


def test_backend_probe_without_backend_info_plans_for_the_cpu_and_says_so() -> None:
    backend = probe_backend(None)
    assert backend.backends == ("CPU",) and not backend.gpu_offload
    assert backend.error == hardware.NOT_ASKED


def test_importing_hardware_and_plan_does_not_load_llama_cpp() -> None:
    code = (
        "import sys, localfab.machine.probes, localfab.plan, localfab.gguf.facts, "
        "localfab.commands.planning; "
        "bad = [m for m in ('llama_cpp', 'textual') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
