"""Where a vision projector goes beside its model, and what an image costs.

llama.cpp's `clip` puts all of a projector's weights and its compute buffer on one device: the
GPU with `--mmproj-offload` (llama-server's default) where there is one, else the CPU. The
compute buffer is reserved at load for the largest image (the projector's own square size):
the peak of ggml's graph allocator over the vision transformer's graph, modelled below by its
phases and checked against the sizes llama.cpp reports (`tests/plan/test_plan_projector.py`).
With offload, `plan_together` keeps the projector's room on the GPU first and plans the model
in the rest, as Ollama does: where the model's plan left that much free, nothing changes but
the accounting (a draft model placed later does not count the projector's bytes as free);
where it did not, the model gets a quantized KV cache, a smaller context or fewer layers,
since an image is encoded on the GPU many times faster than on the CPU.

An image costs its tokens in the context (the KV cells they fill, like text) and, while it is
encoded, the compute buffer reserved above: nothing more per image.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from localfab.gguf.facts import ModelFacts
from localfab.gguf.projector import ProjectorFacts
from localfab.machine.probes import Machine
from localfab.plan.policy import plan
from localfab.plan.result import Plan, Wishes
from localfab.units import MiB, format_bytes

F32 = 4


@dataclass(frozen=True)
class ProjectorPlan:
    """The projector's place and cost, and an image's cost in the model's context."""

    name: str
    device: str  # the GPU's name, or "CPU"
    weights: int
    compute: int
    room: int  # what the model's plan left free on that device
    fits: bool
    reason: str
    image_tokens: int | None  # per image; None where it depends on the image's size
    image_kv: int | None  # the KV cache bytes those tokens fill

    @property
    def total(self) -> int:
        return self.weights + self.compute

    @property
    def use_gpu(self) -> bool:
        return self.device != "CPU"

    def describe(self) -> str:
        """One line for the plan's reasons and the server's log."""
        weights, compute = _size(self.weights), _size(self.compute)
        cost = f"{weights} weights + {compute} compute"
        if not self.fits:
            return f"vision projector {self.name} ({cost}) fits nowhere: {self.reason}"
        where = "the CPU" if self.device == "CPU" else f"the GPU ({self.device})"
        return f"vision projector {self.name}: {cost} on {where}; {self.reason}"

    def image_cost(self) -> str:
        if self.image_tokens is None:
            return "an image takes tokens of the context by its size (this projector resizes)"
        kv = f" ({_size(self.image_kv)} of KV cache)" if self.image_kv else ""
        return f"an image takes {self.image_tokens} tokens of the context{kv}"


def _size(n: int) -> str:
    """Bytes as a plan says them, small ones too (a test projector's are KiB)."""
    return format_bytes(n, precise=n < 10 * MiB)


def projector_compute(proj: ProjectorFacts, *, flash_attn: bool = True) -> int:
    """The compute buffer llama.cpp reserves for the projector's graph at its largest image:
    the larger of two phases of ggml's graph allocator. The feed-forward of a layer holds the
    residual, the normed input and the output (n_patches x width each) beside the up
    projection (n_patches x ff): exact for real projector sizes (Gemma 3's 121.25 MiB). The
    projection into the text model's space holds its transposed weight and output, with what
    is left of the last layer: fitted to the sizes llama.cpp reports for small projectors,
    where it is the larger (within 18 %, 11 % for the test projector)."""
    n, d, ff = proj.n_patches, proj.n_embd, proj.n_ff
    tokens = proj.image_tokens or n
    e = proj.projection_dim or d
    weight = proj.weights_type_size
    ffn = 3 * n * d * F32 + n * ff * F32
    if not flash_attn:  # the KQ matrix of every head, beside the residual, Q, K and V
        ffn = max(ffn, n * n * proj.n_head * F32 + 4 * n * d * F32)
    projection = (
        d * e * weight + tokens * e * F32 + (n * d + 3 * n * ff + 3 * tokens * d) * F32 // 2
    )
    return max(ffn, projection)


def _room(target: Plan, device: str) -> int:
    m = target.device_memory(device)
    return 0 if m is None else max(0, m.free_left)


def _image_kv(target: Plan, tokens: int | None) -> int | None:
    kv = sum(m.kv for m in target.memory)
    if tokens is None or not target.n_ctx:
        return None
    return tokens * kv // target.n_ctx


def flash_attention_fits(proj: ProjectorFacts) -> bool:
    """Whether llama.cpp's backends run the projector's attention fused (head sizes that are
    multiples of 8: CUDA's and Vulkan's kernels, and the CPU's for any)."""
    return proj.n_head > 0 and (proj.n_embd // proj.n_head) % 8 == 0


def gpu_need(proj: ProjectorFacts) -> int:
    """The bytes the projector takes on a GPU: its weights and its compute buffer there."""
    return proj.weights + projector_compute(proj, flash_attn=flash_attention_fits(proj))


def plan_together(
    model: ModelFacts,
    target: Plan,
    proj: ProjectorFacts,
    machine: Machine,
    wishes: Wishes,
    *,
    name: str,
    offload: bool = True,
) -> tuple[Plan, ProjectorPlan]:
    """The model's plan and its projector's: with offload, the model planned again with the
    projector's room on its GPU kept first, where the model still fits so (for a model whose
    plan left that room, the same plan with its free memory less the projector's); else
    `target` with the projector beside it (on the CPU where the GPU has no room left)."""
    placed = plan_projector(target, proj, machine, name=name, offload=offload)
    if not offload or target.gpu is None:
        return target, placed
    need = gpu_need(proj)
    devices = tuple(
        replace(d, free=d.free - need) if d.name == target.gpu else d for d in machine.devices
    )
    if any(d.free < 0 for d in devices):
        return target, placed
    again = plan(model, replace(machine, devices=devices), wishes)
    if not again.fits or again.gpu != target.gpu:
        return target, placed
    moved = plan_projector(again, proj, machine, name=name, reserved=need)
    if not moved.use_gpu:
        return target, placed
    if placed.use_gpu:  # it fitted beside the model's plan: the same place, counted in it
        return again, replace(moved, reason=placed.reason)
    kept = f"its room there was kept before the model was planned ({_changes(target, again)})"
    return again, replace(moved, reason=kept)


def _changes(before: Plan, after: Plan) -> str:
    """What keeping the projector's room changed in the model's plan, in a few words."""
    said = []
    if after.n_ctx != before.n_ctx:
        said.append(f"context {after.n_ctx} instead of {before.n_ctx}")
    if (after.type_k, after.type_v) != (before.type_k, before.type_v):
        said.append(
            f"KV cache {after.type_k}/{after.type_v} instead of {before.type_k}/{before.type_v}"
        )
    if after.n_gpu_layers != before.n_gpu_layers:
        said.append(f"{after.n_gpu_layers} GPU layers instead of {before.n_gpu_layers}")
    return "; ".join(said) or "the model's plan is the same"


def plan_projector(
    target: Plan,
    proj: ProjectorFacts,
    machine: Machine,
    *,
    name: str,
    offload: bool = True,
    reserved: int = 0,
) -> ProjectorPlan:
    """Place the projector `proj` (called `name`) beside the model planned as `target`
    (`reserved`: bytes the model's plan kept free on its GPU for the projector)."""
    weights = proj.weights
    tokens = proj.image_tokens
    image_kv = _image_kv(target, tokens)
    gpu = next((d for d in machine.devices if d.name == target.gpu), None)
    note = ""
    if offload and gpu is not None:
        compute = projector_compute(proj, flash_attn=flash_attention_fits(proj))
        room = _room(target, gpu.name) + reserved
        if weights + compute <= room:
            reason = f"{format_bytes(room)} was free there beside the model"
            return ProjectorPlan(
                name, gpu.name, weights, compute, room, True, reason, tokens, image_kv
            )
        note = (
            f"the GPU has {format_bytes(room)} left beside the model, it needs "
            f"{format_bytes(weights + compute)}; "
        )
    elif not offload and target.gpu is not None:
        note = "--no-mmproj-offload; "
    compute = projector_compute(proj, flash_attn=True)
    room = _room(target, "CPU")
    fits = weights + compute <= room
    reason = f"{note}{format_bytes(room)} of RAM is left beside the model"
    if not fits:
        reason += f", it needs {format_bytes(weights + compute)}: a smaller -c leaves more"
    return ProjectorPlan(name, "CPU", weights, compute, room, fits, reason, tokens, image_kv)
