"""The plan's words: why each choice was made, what went wrong, and what overrides cost.

Every sentence the planner shows a user is built here from numbers the policy and the memory
model computed, so the policy reads as decisions and this module as prose.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from localfab.gguf.facts import ModelFacts
from localfab.machine.probes import Device, Machine
from localfab.plan.kv_types import KV
from localfab.plan.memory import (
    BANDWIDTH_EFFICIENCY,
    FALLBACK_CPU_BANDWIDTH_GBS,
    FALLBACK_GPU_BANDWIDTH_GBS,
    ComputePhases,
    Estimate,
    cpu_bandwidth,
    gpu_bandwidth,
)
from localfab.plan.result import Plan, Wishes
from localfab.units import format_bytes


def kv_total(e: Estimate) -> int:
    """KV cache bytes over every device."""
    return sum(m.kv for m in e.memory)


def model_name(facts: ModelFacts) -> str:
    return facts.name or facts.arch


# --- the device --------------------------------------------------------------------------------


def rebuild_reason(device: Device, have: str, rebuild: str) -> str:
    return (
        f"{device.name} is present, but the installed llama-cpp-python was built for {have}, so "
        f"this plan runs on the CPU. To use the GPU, rebuild it: {rebuild}"
    )


def one_gpu_reason(gpu: Device | None, others: Sequence[Device]) -> str:
    return (
        f"Planning for {gpu.name if gpu else '?'} only; "
        f"{', '.join(d.name for d in others)} not used (one GPU per plan)."
    )


def placement(gpu: Device | None, ngl: int, full: int) -> str:
    """Where the model would live, for sentences like "does not fit {placement}"."""
    if gpu is not None and ngl == full:
        return f"on {gpu.name}"
    if gpu is not None and 0 < ngl < full:
        return f"with {ngl} layers on {gpu.name}"
    return "in memory"


# --- the rungs of the policy -------------------------------------------------------------------


def kv_quantized_reason(target: int, where: str, kv: KV, chosen: Estimate, f16: Estimate) -> str:
    return (
        f"An f16 KV cache for {target} tokens does not fit {where} "
        f"({f16.shortfall}); a {kv[0]} cache takes {format_bytes(kv_total(chosen))} instead "
        f"of {format_bytes(kv_total(f16))}, with little loss in quality "
        f"(it needs flash attention, which is on)."
    )


def ctx_lowered_reason(target: int, where: str, kv: KV, best: int, floor: int) -> str:
    return (
        f"{target} tokens do not fit {where} even with a {kv[0]} cache; the context is "
        f"lowered to {best} tokens (the floor is {floor})."
    )


def partial_reason(
    gpu: Device, ngl: int, floor: int, kv: KV, whole: Estimate | None, n_layer: int
) -> str:
    """Why only `ngl` layers go on the GPU; `whole` is the all-on-GPU estimate (None if ngl=0)."""
    if ngl == 0 or whole is None:
        return (
            f"Not even the output layer fits on {gpu.name} beside the compute buffer at "
            f"{floor} tokens; the model runs on the CPU."
        )
    rep = max(0, ngl - 1)
    return (
        f"At the {floor}-token floor with a {kv[0]} cache the whole model does not fit "
        f"({whole.shortfall}): -ngl {ngl} puts the output layer and the last {rep} of "
        f"{n_layer} repeating layers on the GPU; the other {n_layer - rep} run on the "
        f"CPU from RAM and slow decoding down."
    )


def does_not_fit_warning(facts: ModelFacts, floor: int, kv: KV, e: Estimate) -> str:
    return (
        f"{model_name(facts)} does not fit even at {floor} tokens with a {kv[0]} cache: "
        f"{e.shortfall}. Close other programs, pick a smaller model or quant, or lower the "
        f"context with -c (at your own risk below {floor})"
    )


# --- the rest of the plan ----------------------------------------------------------------------


def fits_summary(gpu: Device | None, ngl: int, full: int, n_ctx: int, kv: KV) -> str | None:
    """The opening sentence of a plan that fits as asked, if there is one to say."""
    if gpu is not None and ngl == full:
        return (
            f"All {full - 1} layers and the output layer fit on {gpu.name} with a "
            f"{n_ctx}-token context and a {kv[0]}/{kv[1]} KV cache."
        )
    if gpu is None:
        return f"The model runs on the CPU with a {n_ctx}-token context."
    return None


def as_asked(wishes: Wishes, *, ngl_fixed: bool, kv: KV) -> Iterator[str]:
    """One line per explicit choice the plan honours."""
    if ngl_fixed:
        yield f"-ngl {wishes.n_gpu_layers} as you asked."
    if wishes.n_ctx:
        yield f"-c {wishes.n_ctx} as you asked."
    if wishes.type_k or wishes.type_v:
        yield f"KV cache {kv[0]}/{kv[1]} as you asked."


def igpu_reason(gpu: Device, machine: Machine) -> str:
    carve = format_bytes(gpu.vram_total or 0)
    gtt = format_bytes(gpu.gtt_total or 0)
    return (
        f"{gpu.name} is an integrated GPU sharing system RAM ({carve} carve-out + {gtt} GTT "
        f"via {gpu.kind}); what it takes beyond the carve-out comes out of the "
        f"{format_bytes(machine.ram_available)} of free RAM. Offloading to it speeds up prompt "
        f"processing much more than decoding, which reads the same RAM at the same "
        f"bandwidth either way."
    )


def swa_reason(facts: ModelFacts, *, swa_full: bool, extra: int) -> str | None:
    """The sliding-window cache: kept full-size for `extra` bytes, or window-only."""
    n_swa = sum(facts.swa_layers)
    if not swa_full:
        return (
            f"{n_swa} of {facts.n_layer} layers use a {facts.sliding_window}-token sliding window "
            f"and keep only the window (swa_full off): the KV cache cannot be shifted."
        )
    if extra <= 0:
        return None
    return (
        f"{n_swa} of {facts.n_layer} layers use a {facts.sliding_window}-token sliding "
        f"window; their cache is kept full-size (swa_full) so the KV cache can be "
        f"shifted when a chat outgrows the context, which costs {format_bytes(extra)}."
    )


def flash_attn_reason(flash_attn: bool) -> str:
    if flash_attn:
        return "Flash attention on: it shrinks the compute buffer and allows a quantized KV cache."
    return (
        "Flash attention off, as you asked: the KV cache stays f16 and the compute buffer "
        "grows with the context."
    )


def batch_reason(facts: ModelFacts, phases: ComputePhases, n_ubatch: int, n_batch: int) -> str:
    if phases.logits >= phases.layers_peak and facts.n_vocab >= 100_000:
        return (
            f"n_ubatch {n_ubatch}, n_batch {n_batch}: the {facts.n_vocab:,}-token vocabulary "
            f"makes the compute buffer {format_bytes(phases.peak)} (logits for {n_ubatch} tokens); "
            f"a smaller n_ubatch shrinks it at some cost in prompt speed."
        )
    return f"n_ubatch {n_ubatch}, n_batch {n_batch} (llama.cpp's defaults)."


def threads_reason(threads: int, *, asked: bool, machine: Machine) -> str:
    note = "as you asked" if asked else "one per physical core; hyper-threads do not help"
    perf = machine.cpu.performance_cores
    if not asked and perf and perf < machine.cpu.physical_cores:
        note += (
            f" (this CPU has {perf} performance cores; if decoding stutters, try --threads {perf})"
        )
    return f"{threads} CPU threads: {note}."


def speed_reason(final: Estimate, gpu: Device | None, machine: Machine) -> str:
    parts = []
    if final.bytes_per_token_gpu and gpu is not None:
        parts.append(
            f"{format_bytes(final.bytes_per_token_gpu)} from {gpu.name} "
            f"({gpu_bandwidth(gpu, machine):.0f} GB/s)"
        )
    if final.bytes_per_token_cpu:
        parts.append(
            f"{format_bytes(final.bytes_per_token_cpu)} from RAM "
            f"({cpu_bandwidth(machine):.0f} GB/s)"
        )
    return (
        f"Predicted decoding ≈ {final.tok_s:.0f} tok/s: each token reads "
        f"{' and '.join(parts) or 'nothing'} at about {BANDWIDTH_EFFICIENCY:.0%} of the "
        f"theoretical bandwidth, with the context half full."
    )


def bandwidth_assumptions(gpu: Device | None, machine: Machine) -> Iterator[str]:
    """The fallback bandwidths the speed estimate used, if any."""
    if gpu is not None and not gpu.bandwidth_gbs and not gpu.unified_memory:
        yield f"bandwidth of {gpu.name} unknown: assumed {FALLBACK_GPU_BANDWIDTH_GBS:.0f} GB/s"
    if not machine.cpu.bandwidth_gbs:
        yield f"RAM bandwidth unknown: assumed {FALLBACK_CPU_BANDWIDTH_GBS} GB/s"


# --- what overrides cost -----------------------------------------------------------------------


def _gpu_total(p: Plan) -> int:
    mem = p.device_memory(p.gpu) if p.gpu else None
    return mem.total if mem is not None else 0


def _asked(wishes: Wishes) -> str:
    flags = (
        ("-c", wishes.n_ctx),
        ("-ngl", wishes.n_gpu_layers),
        ("-ctk", wishes.type_k),
        ("-ctv", wishes.type_v),
    )
    return " ".join(f"{flag} {value}" for flag, value in flags if value is not None)


def costs(p: Plan, auto: Plan, wishes: Wishes) -> Iterator[str]:
    """What the user's explicit choices cost against the plan localfab would have made."""
    kv_p = sum(m.kv for m in p.memory)
    kv_a = sum(m.kv for m in auto.memory)
    yield (
        f"{_asked(wishes)}: {p.n_ctx} tokens with a {p.type_k}/{p.type_v} cache "
        f"({format_bytes(kv_p)}) and -ngl {p.n_gpu_layers}, against the automatic plan's "
        f"{auto.n_ctx} tokens, {auto.type_k}/{auto.type_v} ({format_bytes(kv_a)}) and "
        f"-ngl {auto.n_gpu_layers}."
    )
    if p.gpu:
        yield f"GPU memory: {format_bytes(_gpu_total(p))} against {format_bytes(_gpu_total(auto))}."
    if abs(p.predicted_tok_s - auto.predicted_tok_s) >= 0.5:
        yield (
            f"Predicted decoding ≈ {p.predicted_tok_s:.0f} tok/s against "
            f"{auto.predicted_tok_s:.0f} tok/s."
        )
    if not p.fits and auto.fits:
        yield "Your choices do not fit this machine; the automatic plan does."


def prompt_cache_reason(budget: int, kv_per_token: float) -> str:
    """What the prompt cache may take of RAM, and what one chat's state costs in it."""
    chat = format_bytes(4000 * kv_per_token)
    if budget <= 0:
        return (
            "No RAM is left for a prompt cache: idle chats' KV states go only to the disk tier "
            "(prompt_cache_disk)."
        )
    return (
        f"Prompt cache: up to {format_bytes(budget)} of RAM (half of what this load leaves "
        f"free, at most llama-server's 8 GiB; serve --cache-ram sets it) keeps idle chats' KV "
        f"states, about {kv_per_token / 1024:,.0f} KiB per token: a 4,000-token chat takes "
        f"{chat}. They also go to disk (prompt_cache_disk, 4 GiB by default)."
    )
