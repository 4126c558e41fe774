"""The planner's policy: which configuration to load, given the memory model.

Keep everything on the GPU if it fits; else quantize the KV cache to q8_0 (needs flash
attention); else lower the context toward the floor (default 4096, never below the user's
minimum); else offload only part of the model. Explicit user choices are honoured and the plan
says what they cost against the plan it would have made.

`_plan` runs in three steps: resolve the wishes (flash attention, KV types, batches, context
range), pick the device (one GPU, or the CPU, and a fixed -ngl if asked), and search the
policy's rungs for the first configuration that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from localfab.errors import UsageError
from localfab.gguf.facts import ModelFacts
from localfab.machine.probes import Device, Machine
from localfab.plan import explain
from localfab.plan.kv_types import KV, check_kv_type
from localfab.plan.memory import (
    CTX_STEP,
    DEFAULT_N_BATCH,
    DEFAULT_N_UBATCH,
    Estimate,
    compute_phases,
    estimate,
    pad,
)
from localfab.plan.result import DEFAULT_TARGET_CTX, DeviceMemory, Plan, Wishes
from localfab.units import PROMPT_CACHE_RAM

REBUILD = {
    "cuda": 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python",
    "vulkan": 'CMAKE_ARGS="-DGGML_VULKAN=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python",
    "rocm": 'CMAKE_ARGS="-DGGML_HIP=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python",
}

Choice = tuple[int, int, KV]  # (n_gpu_layers, n_ctx, (type_k, type_v))


def plan(facts: ModelFacts, machine: Machine, wishes: Wishes | None = None) -> Plan:
    """Choose how to load `facts` on `machine`, honouring `wishes`; a pure function."""
    wishes = wishes or Wishes()
    result = _plan(facts, machine, wishes)
    if wishes.has_overrides:
        auto = _plan(
            facts,
            machine,
            replace(wishes, n_ctx=None, n_gpu_layers=None, type_k=None, type_v=None),
        )
        result = replace(result, costs=tuple(explain.costs(result, auto, wishes)))
    return result


# --- 1. resolve the wishes ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Resolved:
    """The wishes checked, with the planner's defaults filled in."""

    flash_attn: bool
    kv_ladder: tuple[KV, ...]  # KV cache types to try, most precise first
    n_batch: int
    n_ubatch: int
    target: int  # the context to aim for
    floor: int  # the context not to go below


def _kv_ladder(wishes: Wishes, flash_attn: bool) -> tuple[KV, ...]:
    type_k = check_kv_type(wishes.type_k, "-ctk") if wishes.type_k else None
    type_v = check_kv_type(wishes.type_v, "-ctv") if wishes.type_v else None
    if not flash_attn and type_v not in (None, "f16", "f32", "bf16"):
        raise UsageError(
            f"-ctv {type_v} needs flash attention (llama.cpp cannot quantize the V cache "
            f"without it): drop -fa off or use -ctv f16"
        )
    if type_k or type_v:
        return ((type_k or "f16", type_v or "f16"),)
    return (("f16", "f16"),) + ((("q8_0", "q8_0"),) if flash_attn else ())


def _batches(wishes: Wishes) -> tuple[int, int]:
    """(n_batch, n_ubatch): llama.cpp's defaults, n_ubatch never above n_batch."""
    n_ubatch = wishes.n_ubatch or DEFAULT_N_UBATCH
    n_batch = max(wishes.n_batch or DEFAULT_N_BATCH, n_ubatch)
    if wishes.n_batch and wishes.n_batch < n_ubatch:
        n_ubatch = wishes.n_batch
        n_batch = wishes.n_batch
    return n_batch, n_ubatch


def _context_range(facts: ModelFacts, wishes: Wishes, warnings: list[str]) -> tuple[int, int]:
    """(target, floor): an explicit -c is both; otherwise the default range within training."""
    n_ctx_train = facts.n_ctx_train or DEFAULT_TARGET_CTX
    if not wishes.n_ctx:
        target = min(n_ctx_train, wishes.max_ctx or DEFAULT_TARGET_CTX)
        return target, min(max(wishes.min_ctx, 1), target)
    if wishes.n_ctx < 1:
        raise UsageError(f"-c {wishes.n_ctx}: the context must be at least 1 token")
    if wishes.n_ctx > n_ctx_train:
        warnings.append(
            f"-c {wishes.n_ctx} is beyond the {n_ctx_train} tokens the model was trained on: "
            f"expect worse answers past {n_ctx_train} tokens"
        )
    return wishes.n_ctx, wishes.n_ctx


def _resolve(facts: ModelFacts, wishes: Wishes, warnings: list[str]) -> _Resolved:
    fa_wish = wishes.flash_attn.lower()
    if fa_wish not in ("auto", "on", "off"):
        raise UsageError(f"-fa {wishes.flash_attn}: use auto, on or off")
    flash_attn = fa_wish != "off"
    kv_ladder = _kv_ladder(wishes, flash_attn)
    n_batch, n_ubatch = _batches(wishes)
    target, floor = _context_range(facts, wishes, warnings)
    return _Resolved(flash_attn, kv_ladder, n_batch, n_ubatch, target, floor)


# --- 2. pick the device ------------------------------------------------------------------------


@dataclass(frozen=True)
class _Placement:
    gpu: Device | None  # the one GPU the plan may use
    ngl_fixed: int | None  # -ngl as asked, clamped; None lets the planner choose
    rebuild: str | None  # the command that would make a present GPU usable


def _pick_gpu(machine: Machine) -> Device | None:
    usable = machine.usable_devices()
    return max(usable, key=lambda d: d.free) if usable else None


def _pick_device(
    machine: Machine, wishes: Wishes, full: int, reasons: list[str], warnings: list[str]
) -> _Placement:
    gpu = _pick_gpu(machine)
    rebuild = None
    unusable = [d for d in machine.devices if d not in machine.usable_devices()]
    if gpu is None and unusable:
        kind = "cuda" if unusable[0].vendor == "nvidia" else "vulkan"
        rebuild = REBUILD[kind]
        reasons.append(explain.rebuild_reason(unusable[0], machine.backend.label, rebuild))
    if machine.backend.error:
        warnings.append(f"could not ask llama-cpp-python for its backends: {machine.backend.error}")
    others = [d for d in machine.usable_devices() if d is not gpu]
    if others:
        reasons.append(explain.one_gpu_reason(gpu, others))

    ngl_fixed: int | None = None
    if wishes.n_gpu_layers is not None:
        ngl_fixed = full if wishes.n_gpu_layers < 0 else min(wishes.n_gpu_layers, full)
        if gpu is None and ngl_fixed > 0:
            warnings.append(f"-ngl {wishes.n_gpu_layers} ignored: no GPU this build can use")
            ngl_fixed = 0
    return _Placement(gpu, ngl_fixed, rebuild)


# --- 3. search the rungs -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Estimator:
    """`estimate` with everything but the searched dimensions fixed."""

    facts: ModelFacts
    machine: Machine
    gpu: Device | None
    flash_attn: bool
    n_ubatch: int
    swa_full: bool

    def __call__(self, ngl: int, ctx: int, kv: KV, *, swa_full: bool | None = None) -> Estimate:
        return estimate(
            self.facts,
            self.machine,
            gpu=self.gpu,
            n_gpu_layers=ngl,
            n_ctx=ctx,
            type_k=kv[0],
            type_v=kv[1],
            flash_attn=self.flash_attn,
            n_ubatch=self.n_ubatch,
            swa_full=self.swa_full if swa_full is None else swa_full,
        )


@dataclass(frozen=True)
class _Search:
    est: _Estimator
    r: _Resolved
    gpu: Device | None
    ngl_fixed: int | None
    full: int  # n_layer + 1: every layer and the output layer on the GPU

    @property
    def ngl_try(self) -> int:
        """The -ngl the first two rungs use: as asked, else all (none without a GPU)."""
        if self.ngl_fixed is not None:
            return self.ngl_fixed
        return self.full if self.gpu is not None else 0


def _at_target(s: _Search, reasons: list[str]) -> tuple[Choice, str] | None:
    """Rung 1: everything at the target context, f16 then q8_0 cache."""
    ladder, target = s.r.kv_ladder, s.r.target
    for i, kv in enumerate(ladder):
        e = s.est(s.ngl_try, target, kv)
        if not e.fits:
            continue
        if i == 0:
            return (s.ngl_try, target, kv), "fits"
        where = explain.placement(s.gpu, s.ngl_try, s.full)
        f16 = s.est(s.ngl_try, target, ladder[0])
        reasons.append(explain.kv_quantized_reason(target, where, kv, e, f16))
        return (s.ngl_try, target, kv), "kv-" + kv[0]
    return None


def _lowered_ctx(s: _Search, reasons: list[str]) -> tuple[Choice, str] | None:
    """Rung 2: lower the context toward the floor, with the most compact cache."""
    floor, target, kv = s.r.floor, s.r.target, s.r.kv_ladder[-1]
    if floor >= target:
        return None
    best = _largest_ctx(lambda c: s.est(s.ngl_try, c, kv).fits, floor, target)
    if best is None:
        return None
    where = explain.placement(s.gpu, s.ngl_try, s.full)
    reasons.append(explain.ctx_lowered_reason(target, where, kv, best, floor))
    return (s.ngl_try, best, kv), "ctx"


def _partial(s: _Search, reasons: list[str]) -> tuple[Choice, str] | None:
    """Rung 3: partial offload at the floor (only when -ngl was not given)."""
    if s.gpu is None or s.ngl_fixed is not None:
        return None
    floor, kv = s.r.floor, s.r.kv_ladder[-1]
    # GPU memory grows with -ngl and CPU memory shrinks: take the most the GPU holds, then
    # check the CPU side at that point (fewer layers on the GPU would only need more RAM)
    lo = _largest_ngl(lambda n: s.est(n, floor, kv).gpu_fits, s.full - 1)
    if lo is None or not s.est(lo, floor, kv).cpu_fits:
        return None
    whole = s.est(s.full, floor, kv) if lo else None
    reasons.append(explain.partial_reason(s.gpu, lo, floor, kv, whole, s.full - 1))
    return (lo, floor, kv), "partial"


def _search(s: _Search, reasons: list[str], warnings: list[str]) -> tuple[Choice, str, bool]:
    """The first rung that fits: (choice, step, fits)."""
    for rung in (_at_target, _lowered_ctx, _partial):
        found = rung(s, reasons)
        if found is not None:
            return found[0], found[1], True
    kv = s.r.kv_ladder[-1]
    e = s.est(s.ngl_try, s.r.floor, kv)
    warnings.append(explain.does_not_fit_warning(s.est.facts, s.r.floor, kv, e))
    return (s.ngl_try, s.r.floor, kv), "does-not-fit", False


def _largest_ctx(fits: Callable[[int], bool], floor: int, target: int) -> int | None:
    """Largest context in [floor, target] that fits: multiples of CTX_STEP, plus the floor."""
    candidates = sorted({floor, *range(pad(floor, CTX_STEP), target + 1, CTX_STEP)})
    candidates = [c for c in candidates if floor <= c < target]
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:  # memory grows with the context: binary search
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best


def _largest_ngl(fits: Callable[[int], bool], top: int) -> int | None:
    """Largest n_gpu_layers in [0, top] that fits (GPU memory grows with it)."""
    lo, hi, best = 0, top, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


# --- the whole plan ----------------------------------------------------------------------------


def _closing_reasons(
    s: _Search, wishes: Wishes, choice: Choice, final: Estimate, threads: int
) -> list[str]:
    """The reasons for everything the search did not decide."""
    facts, machine, gpu = s.est.facts, s.est.machine, s.gpu
    ngl, n_ctx, kv = choice
    reasons = list(explain.as_asked(wishes, ngl_fixed=s.ngl_fixed is not None, kv=kv))
    if gpu is not None and gpu.unified_memory:
        reasons.append(explain.igpu_reason(gpu, machine))
    if facts.sliding_window and any(facts.swa_layers):
        extra = 0
        if wishes.swa_full:
            small = s.est(ngl, n_ctx, kv, swa_full=False)
            extra = explain.kv_total(final) - explain.kv_total(small)
        swa = explain.swa_reason(facts, swa_full=wishes.swa_full, extra=extra)
        reasons += [swa] if swa else []
    reasons.append(explain.flash_attn_reason(s.r.flash_attn))
    phases = compute_phases(
        facts, n_ctx, n_ubatch=s.r.n_ubatch, flash_attn=s.r.flash_attn, swa_full=wishes.swa_full
    )
    reasons.append(explain.batch_reason(facts, phases, s.r.n_ubatch, s.r.n_batch))
    reasons.append(explain.threads_reason(threads, asked=bool(wishes.threads), machine=machine))
    reasons.append(explain.speed_reason(final, gpu, machine))
    return reasons


def prompt_cache_budget(memory: Sequence[DeviceMemory]) -> int:
    """The RAM a prompt cache may hold once the load is in: half of what is left free, at
    most llama-server's default (8 GiB)."""
    cpu = next((m for m in memory if m.device == "CPU"), None)
    return 0 if cpu is None else min(PROMPT_CACHE_RAM, max(0, cpu.free_left) // 2)


def _plan(facts: ModelFacts, machine: Machine, wishes: Wishes) -> Plan:
    reasons: list[str] = []
    warnings: list[str] = []
    full = facts.n_layer + 1
    r = _resolve(facts, wishes, warnings)
    device = _pick_device(machine, wishes, full, reasons, warnings)
    gpu = device.gpu
    est = _Estimator(facts, machine, gpu, r.flash_attn, r.n_ubatch, wishes.swa_full)
    search = _Search(est, r, gpu, device.ngl_fixed, full)
    choice, step, fits = _search(search, reasons, warnings)
    ngl, n_ctx, kv = choice
    final = est(ngl, n_ctx, kv)

    if fits and step == "fits":
        summary = explain.fits_summary(gpu, ngl, full, n_ctx, kv)
        reasons[:0] = [summary] if summary else []
    threads = wishes.threads or max(1, machine.cpu.physical_cores)
    reasons += _closing_reasons(search, wishes, choice, final, threads)
    cache = prompt_cache_budget(final.memory)
    reasons.append(explain.prompt_cache_reason(cache, explain.kv_total(final) / max(n_ctx, 1)))
    if device.ngl_fixed is not None and not final.fits:
        warnings.append(
            f"-ngl {wishes.n_gpu_layers} will likely run out of memory: {final.shortfall}"
        )

    return Plan(
        model=explain.model_name(facts),
        arch=facts.arch,
        n_layer=facts.n_layer,
        n_gpu_layers=ngl if gpu is not None else 0,
        n_ctx=n_ctx,
        type_k=kv[0],
        type_v=kv[1],
        flash_attn=r.flash_attn,
        swa_full=wishes.swa_full,
        n_batch=r.n_batch,
        n_ubatch=r.n_ubatch,
        threads=threads,
        threads_batch=threads,
        op_offload=final.op_offload,
        gpu=gpu.name if gpu is not None else None,
        gpu_kind=gpu.kind if gpu is not None else None,
        memory=final.memory,
        fits=fits and final.fits,
        predicted_tok_s=final.tok_s,
        bytes_per_token_gpu=final.bytes_per_token_gpu,
        bytes_per_token_cpu=final.bytes_per_token_cpu,
        step=step,
        reasons=tuple(reasons),
        warnings=tuple(warnings),
        rebuild=device.rebuild,
        assumptions=tuple(explain.bandwidth_assumptions(gpu, machine)),
        prompt_cache=cache,
    )
