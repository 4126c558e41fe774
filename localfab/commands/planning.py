"""`localfab plan` and `localfab doctor`: how a model fits this (or another) machine.

Only click and light localfab modules are imported at module level; the planner, the hardware
probes and the GGUF reader are imported inside the commands, and llama_cpp only through the
engine's `backend_info()`, which this front end hands to the hardware probe when the real machine
is probed (the hardware layer sits below the engine and never imports it).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localfab.errors import UsageError
from localfab.units import KV_CACHE_TYPES, MiB, format_bytes

if TYPE_CHECKING:
    from localfab.gguf.facts import ModelFacts
    from localfab.machine.probes import Machine
    from localfab.plan import Plan, Wishes

KV_CHOICES = click.Choice(KV_CACHE_TYPES)


def _resolve(model: str) -> Path:
    """MODEL -> a GGUF path: a file, the embedded `gemma3:270m`, or a registered name.

    Planning only reads the header, so this does not mark the model as used (`localfab list`
    shows when a model last ran, not when it was last looked at).
    """
    from localfab.config import default_paths
    from localfab.store import Store

    return Store(default_paths()).resolve(model)


def _machine(profile: str | None, vram: int | None, ram: int | None) -> Machine:
    """The machine to plan for: a shipped profile, a what-if (--vram/--ram), or this one."""
    from dataclasses import replace

    from localfab.machine import probes as hardware

    if profile and (vram is not None or ram is not None):
        raise UsageError("give either --profile or --vram/--ram, not both")
    if profile:
        return hardware.machine_from_profile_name(profile)
    if vram is None and ram is None:
        from localfab.runtime import probe_this_machine

        return probe_this_machine()
    if (vram is not None and vram < 0) or (ram is not None and ram < 0):
        raise UsageError("--vram and --ram are sizes in MiB and cannot be negative")
    cpu, ram_total, ram_available = hardware.probe_cpu()
    backend = hardware.LlamaBackend(backends=("CPU",), gpu_offload=False, system_info="what-if")
    devices: tuple[hardware.Device, ...] = ()
    if vram:
        size = vram * MiB
        backend = replace(backend, backends=("CPU", "CUDA"), gpu_offload=True)
        devices = (
            hardware.Device(
                index=0,
                name=f"GPU with {vram} MiB free",
                vendor="nvidia",
                kind="cuda",
                total=size,
                used=0,
                free=size,
            ),
        )
    if ram is not None:
        ram_total = ram_available = ram * MiB
    return hardware.Machine(
        cpu=cpu,
        ram_total=ram_total,
        ram_available=ram_available,
        devices=devices,
        backend=backend,
        source=f"what-if: vram {vram} MiB, ram {ram if ram is not None else 'probed'}",
    )


def _wishes(**options: Any) -> Wishes:
    """Wishes from the options, with the user's config.toml / LOCALFAB_* as defaults."""
    from localfab.config import Config, default_paths
    from localfab.runtime import wishes_from_options

    return wishes_from_options(Config.load(default_paths()), **options)


def render_plan(plan: Plan, machine: Machine) -> str:
    """The plan as a readable table with its reasons."""
    lines = [f"Plan for {plan.model} ({plan.arch}, {plan.n_layer} layers) on {_where(machine)}", ""]
    if plan.gpu:
        out = "output layer on GPU" if plan.output_on_gpu else "output layer on CPU"
        layers = (
            f"{plan.n_gpu_layers}/{plan.n_layer + 1} on {plan.gpu} "
            f"({plan.repeating_layers_on_gpu} repeating + {out})"
        )
    else:
        layers = f"0/{plan.n_layer + 1} (CPU only)"
    rows = [
        ("GPU layers (-ngl)", layers),
        ("context (-c)", f"{plan.n_ctx} tokens"),
        ("KV cache (-ctk/-ctv)", f"{plan.type_k} / {plan.type_v}"),
        ("flash attention", "on" if plan.flash_attn else "off"),
        ("batch / ubatch", f"{plan.n_batch} / {plan.n_ubatch}"),
        ("threads", str(plan.threads)),
        ("decode speed", f"≈ {plan.predicted_tok_s:.1f} tok/s (predicted)"),
        ("prompt cache", f"up to {format_bytes(plan.prompt_cache)} of RAM (see Why)"),
        ("fits", "yes" if plan.fits else "NO"),
    ]
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    lines += ["", "Memory"]
    header = ("device", "weights", "KV", "compute", "reserve", "total", "free after")
    table = [header] + [
        (
            m.device + (" (shared RAM)" if m.unified_memory else ""),
            format_bytes(m.weights),
            format_bytes(m.kv),
            format_bytes(m.compute),
            format_bytes(m.reserve),
            format_bytes(m.total),
            format_bytes(m.free_left),
        )
        for m in plan.memory
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  " + "  ".join(cells))
    lines += ["", "Why"]
    lines += [f"  - {r}" for r in plan.reasons]
    if plan.costs:
        lines += ["", "What your choices cost"] + [f"  - {c}" for c in plan.costs]
    if plan.warnings:
        lines += ["", "Warnings"] + [f"  ! {w}" for w in plan.warnings]
    if plan.assumptions:
        lines += ["", "Assumed"] + [f"  ~ {a}" for a in plan.assumptions]
    return "\n".join(lines)


def _where(machine: Machine) -> str:
    if machine.source.startswith("profile:"):
        return f"profile {machine.source.split(':', 1)[1]}"
    return "this machine" if machine.source == "probe" else machine.source


@click.command("plan")
@click.argument("model")
@click.option(
    "-c", "--ctx-size", type=int, default=None, help="Context in tokens (default: chosen)."
)
@click.option("--min-ctx", type=int, default=None, help="Never lower the context below this.")
@click.option("-ngl", "--n-gpu-layers", type=int, default=None, help="Layers on the GPU; -1: all.")
@click.option("-ctk", "--cache-type-k", type=KV_CHOICES, default=None, help="KV cache type for K.")
@click.option("-ctv", "--cache-type-v", type=KV_CHOICES, default=None, help="KV cache type for V.")
@click.option("-fa", "--flash-attn", type=click.Choice(["auto", "on", "off"]), default=None)
@click.option("-b", "--batch-size", type=int, default=None, help="Logical batch (n_batch).")
@click.option("-ub", "--ubatch-size", type=int, default=None, help="Physical batch (n_ubatch).")
@click.option("-t", "--threads", type=int, default=None, help="CPU threads.")
@click.option("--profile", default=None, help="Plan for a shipped hardware profile (see doctor).")
@click.option("--vram", type=int, default=None, help="What-if: a GPU with this many MiB free.")
@click.option("--ram", type=int, default=None, help="What-if: this many MiB of free RAM.")
@click.option(
    "-mm",
    "--mmproj",
    type=click.Path(path_type=Path),
    default=None,
    help="Plan the model's vision projector (mmproj GGUF) beside it, and what an image costs.",
)
@click.option("--mmproj-offload/--no-mmproj-offload", default=True, help="Projector on the GPU.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (bytes).")
def plan(
    model: str,
    profile: str | None,
    vram: int | None,
    ram: int | None,
    as_json: bool,
    mmproj: Path | None,
    mmproj_offload: bool,
    **options: Any,
) -> None:
    """Show how MODEL would be loaded: GPU layers, context, KV cache, memory, speed, and why.

    MODEL is a .gguf path, a registered name, or — to check the fit before downloading — a
    catalog name, OWNER/REPO[:QUANT] or Hugging Face URL, of which only the header is read.
    """
    from localfab.errors import ModelNotFound
    from localfab.gguf.facts import read_facts
    from localfab.plan import plan as make_plan

    machine = _machine(profile, vram, ram)
    fetched: int | None = None
    estimate: str | None = None
    try:
        facts = read_facts(_resolve(model))
    except ModelNotFound:
        # Not on disk: fit before download, reading only the header of the file on the hub
        # (offline, a catalog model's shipped facts).
        facts, fetched, estimate = _remote_facts(model)
    wishes = _wishes(**options)
    result = make_plan(facts, machine, wishes)
    projector = None
    if mmproj is not None:  # planned with the model: its GPU room may be kept first
        from localfab.runtime import plan_with_projector

        result, projector = plan_with_projector(
            facts, result, machine, wishes, mmproj, offload=mmproj_offload
        )
    if as_json:
        data = result.to_dict()
        data["machine"] = machine.to_dict()
        if projector is not None:
            data["projector"] = asdict(projector)
        if fetched is not None:
            data["header_bytes_fetched"] = fetched
        if estimate is not None:
            data["facts_from"] = estimate
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render_plan(result, machine))
        if projector is not None:
            click.echo(f"\n{projector.describe()}\n{projector.image_cost()}")
        if fetched is not None:
            read = format_bytes(fetched, precise=True)
            click.echo(f"\n(planned before download: read {read} of the header)")
        if estimate is not None:
            click.echo(f"\n({estimate})")


def _remote_facts(model: str) -> tuple[ModelFacts, int | None, str | None]:
    """The facts of a model not on disk: its header read on the hub, or (offline) a catalog
    model's shipped facts; with how many header bytes were read, or where the facts came from."""
    from localfab.errors import HubUnreachable
    from localfab.gguf.facts import read_facts
    from localfab.gguf.summary import catalog_facts
    from localfab.hub import open_remote
    from localfab.store.catalog import load_catalog

    try:
        remote = open_remote(model)
    except HubUnreachable as exc:
        entry = load_catalog().get(model)
        shipped = catalog_facts(entry.name) if entry is not None else None
        if entry is None or shipped is None:
            raise
        facts, source = shipped
        origin = "its file's header" if source == "header" else "its published architecture"
        reason = str(exc).split(". This machine")[0]
        note = (
            f"offline, {reason}: planned from the catalog's facts of {entry.name}, taken from "
            f"{origin}; online, the file's own header is read instead"
        )
        return facts, None, note
    return read_facts(remote.sources[0]), remote.bytes_fetched, None


@click.command("doctor")
@click.option("--profile", default=None, help="Check a shipped hardware profile instead.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def doctor(profile: str | None, as_json: bool) -> None:
    """Show the devices found, their memory, and the llama-cpp-python backend; say what to fix.

    Also lists the power sources this machine has (for energy per reply), how to enable the
    missing ones, and whether the usage ledger is being written.
    """
    from localfab.config import default_paths
    from localfab.ledger.writer import Ledger, ledger_path, ledger_status
    from localfab.machine import energy
    from localfab.machine import probes as hardware
    from localfab.runtime import probe_this_machine

    machine = hardware.machine_from_profile_name(profile) if profile else probe_this_machine()
    advice = diagnose(machine)
    power = None if profile else energy.survey()
    ledger = ledger_status(Ledger(ledger_path(default_paths().data_dir)))
    if as_json:
        extra: dict[str, Any] = {"advice": advice, "ledger": ledger}
        if power is not None:
            extra["power"] = [asdict(f) for f in power.findings]
        click.echo(json.dumps(machine.to_dict() | extra, indent=2))
        return
    click.echo(render_doctor(machine, advice))
    if power is not None:
        click.echo("")
        click.echo(energy.render_findings(power))
    click.echo(f"\nUsage ledger\n  {ledger['summary']}")


def diagnose(machine: Machine) -> list[str]:
    """What to do when the hardware and the llama-cpp-python build do not match."""
    from localfab.plan import REBUILD

    advice: list[str] = []
    usable = machine.usable_devices()
    for d in machine.devices:
        if d in usable:
            continue
        kind = "cuda" if d.vendor == "nvidia" else "vulkan"
        advice.append(
            f"{d.name} is not used: llama-cpp-python was built for {machine.backend.label}. "
            f"Rebuild it with {kind.upper()} support: {REBUILD[kind]}"
        )
    if machine.backend.gpu_kinds and not machine.devices:
        advice.append(
            f"llama-cpp-python was built with {machine.backend.label} but no GPU was found: "
            "check the driver (nvidia-smi, or /sys/class/drm for AMD)."
        )
    for d in usable:
        if d.unified_memory:
            advice.append(
                f"{d.name} shares system RAM: localfab plans its memory within free RAM; "
                "offloading to it speeds prompt processing more than decoding."
            )
        if d.vendor == "amd" and d.kind == "rocm" and d.unified_memory:
            advice.append(
                f"ROCm sees only the {format_bytes(d.vram_total or 0)} carve-out of {d.name}; "
                f"Vulkan can also use GTT: {REBUILD['vulkan']}"
            )
    if machine.backend.error:
        advice.append(f"llama-cpp-python could not be queried: {machine.backend.error}")
    if not advice:
        advice.append("Nothing to fix: the build matches the hardware.")
    return advice


def render_doctor(machine: Machine, advice: list[str]) -> str:
    b = machine.backend
    cpu = machine.cpu
    lines = [
        f"Machine: {_where(machine)}",
        f"  CPU: {cpu.model}, {cpu.physical_cores} physical cores, {cpu.logical_cpus} threads"
        + (f", {cpu.bandwidth_gbs:g} GB/s" if cpu.bandwidth_gbs else ""),
        f"  RAM: {format_bytes(machine.ram_available)} free of {format_bytes(machine.ram_total)}",
        f"  llama-cpp-python: {b.version or ''} built for {b.label}".replace("  built", " built"),
        "",
        "GPUs" if machine.devices else "GPUs: none found",
    ]
    usable = machine.usable_devices()
    for d in machine.devices:
        mem = f"{format_bytes(d.free)} free of {format_bytes(d.total)}"
        if d.vram_total is not None:
            mem += (
                f" (carve-out {format_bytes(d.vram_total)}, GTT {format_bytes(d.gtt_total or 0)})"
            )
        extra = ", shares system RAM" if d.unified_memory else ""
        use = "usable" if d in usable else "NOT usable with this build"
        bw = f", {d.bandwidth_gbs:g} GB/s" if d.bandwidth_gbs else ""
        lines.append(f"  [{d.index}] {d.name} ({d.kind}{extra}{bw}): {mem}; {use}")
    lines += ["", "Advice"] + [f"  - {a}" for a in advice]
    return "\n".join(lines)
