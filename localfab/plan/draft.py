"""Where a speculative-decoding draft model goes, beside the model it drafts for.

The model's own plan comes first. The draft then gets its weights, KV cache (the model's context,
f16, as `load_draft` creates it) and compute buffers on the model's GPU when they fit in what the
model's plan leaves free there, and otherwise on the CPU, in the RAM the plan leaves; when it fits
in neither, the model runs without it.
"""

from __future__ import annotations

from dataclasses import dataclass

from localfab.gguf.facts import ModelFacts
from localfab.machine.probes import Device, Machine
from localfab.plan.memory import DEFAULT_N_UBATCH, estimate
from localfab.plan.result import DeviceMemory, Plan
from localfab.units import format_bytes

DRAFT_BATCH = 512  # load_draft's cap on the draft's batch sizes


@dataclass(frozen=True)
class DraftPlan:
    """The draft model's place and cost; `n_gpu_layers` is what to load it with."""

    model: str
    device: str  # the GPU's name, or "CPU"
    n_gpu_layers: int  # all of its layers (and output) on the GPU, or 0
    weights: int
    kv: int
    compute: int
    room: int  # what the model's plan left free on that device
    fits: bool
    reason: str

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    def describe(self) -> str:
        """One line for the plan's reasons and `run -v`."""
        cost = (
            f"{format_bytes(self.weights)} weights + {format_bytes(self.kv)} KV + "
            f"{format_bytes(self.compute)} compute"
        )
        if not self.fits:
            return f"draft model {self.model} ({cost}) fits nowhere: {self.reason}"
        where = "the CPU" if self.device == "CPU" else f"the GPU ({self.device})"
        return f"draft model {self.model}: {cost} on {where}; {self.reason}"


def _need(memory: tuple[DeviceMemory, ...], device: str) -> int:
    """What a configuration puts on `device` besides the reserve (counted once, for the model)."""
    m = next((m for m in memory if m.device == device), None)
    return 0 if m is None else m.weights + m.kv + m.compute


def _room(target: Plan, device: str) -> int:
    m = target.device_memory(device)
    return 0 if m is None else max(0, m.free_left)


def plan_draft(target: Plan, draft: ModelFacts, machine: Machine, *, name: str) -> DraftPlan:
    """Place the draft model `draft` (called `name`) beside the model planned as `target`."""
    n_ubatch = min(target.n_ubatch or DEFAULT_N_UBATCH, DRAFT_BATCH)

    def at(gpu: Device | None, n_gpu_layers: int) -> tuple[DeviceMemory, ...]:
        return estimate(
            draft,
            machine,
            gpu=gpu,
            n_gpu_layers=n_gpu_layers,
            n_ctx=target.n_ctx,
            flash_attn=target.flash_attn,
            n_ubatch=n_ubatch,
            swa_full=True,
        ).memory

    gpu: Device | None = next((d for d in machine.devices if d.name == target.gpu), None)
    cpu_room = _room(target, "CPU")
    if gpu is not None:
        memory = at(gpu, draft.n_layer + 1)
        gpu_need, cpu_need = _need(memory, gpu.name), _need(memory, "CPU")
        gpu_room = _room(target, gpu.name)
        if gpu_need <= gpu_room and cpu_need <= cpu_room:
            m = next(m for m in memory if m.device == gpu.name)
            return DraftPlan(
                name,
                gpu.name,
                draft.n_layer + 1,
                m.weights,
                m.kv,
                m.compute,
                gpu_room,
                True,
                f"{format_bytes(gpu_room)} was free there beside the model",
            )
        gpu_note = (
            f"the GPU has {format_bytes(gpu_room)} left beside the model, "
            f"it needs {format_bytes(gpu_need)}; "
        )
    else:
        gpu_note = "" if target.gpu is None else "the model's GPU was not found; "
    m = next(m for m in at(None, 0) if m.device == "CPU")
    need = m.weights + m.kv + m.compute
    fits = need <= cpu_room
    reason = f"{gpu_note}{format_bytes(cpu_room)} of RAM is left beside the model"
    if not fits:
        reason += f", it needs {format_bytes(need)}: pick a smaller draft model or a smaller -c"
    return DraftPlan(name, "CPU", 0, m.weights, m.kv, m.compute, cpu_room, fits, reason)
