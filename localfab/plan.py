"""The offload planner: (model facts, machine, wishes) -> plan, as a pure function.

It decides how many layers go on the GPU (llama.cpp's `n_gpu_layers`, which counts the output
layer as one), the context size, the KV cache types, flash attention, batch sizes and threads,
and explains each choice. The memory model follows what llama.cpp allocates (file references
are to the llama.cpp vendored by llama-cpp-python 0.3.36):

- weights: exact tensor bytes from the GGUF header, per layer. `n_gpu_layers = k` puts the output
  layer and the last k-1 repeating layers on the GPU (`llama-model.cpp`, `i_gpu_start`); the
  token embedding always stays on the CPU. A tied output (Gemma) is duplicated onto the GPU.
  On the CPU, Q4_0/Q4_K/IQ4_NL/MXFP4 matrices are also copied into a repacked buffer
  (`CPU_REPACK`) while the file stays mapped, so they count twice.
- KV cache: per layer 2 tensors of `n_head_kv × head_dim` elements per cell; the cache has
  `n_ctx` rounded up to 256 cells (`llama-context.cpp`), sliding-window layers only
  `pad256(min(n_ctx, n_swa + n_ubatch))` unless `swa_full` (`llama-kv-cache-iswa.cpp`).
- compute buffer: the peak of ggml's graph allocator over three phases of the worst-case
  (n_ubatch tokens, every output) graph: attention (the KQ masks, the KQ matrix when flash
  attention is off), feed-forward, and the logits (`n_vocab × n_ubatch` floats). Fitted to the
  sizes llama.cpp reports for Gemma 3 270M (see `tests/test_plan.py`, calibration).

Policy (issue 3): keep everything on the GPU if it fits; else quantize the KV cache to q8_0
(needs flash attention); else lower the context toward the floor (default 4096, never below the
user's minimum); else offload only part of the model. Explicit user choices are honoured and the
plan says what they cost against the plan it would have made.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from localfab.errors import EXIT_FIT, LocalfabError, UsageError
from localfab.facts import ModelFacts
from localfab.hardware import Device, Machine

MiB = 1024 * 1024
GiB = 1024 * MiB

# --- constants, and where they come from -------------------------------------------------------

# Context the planner aims for when the user gives none: long enough for multi-turn chats with a
# pasted document, short enough that an 8B model's cache does not crowd out its weights on a
# 6 GB card. Never above the model's training context.
DEFAULT_TARGET_CTX = 16384
# The floor the planner lowers the context to before it moves layers off the GPU (issue 3).
DEFAULT_MIN_CTX = 4096
# llama.cpp pads the context (and the SWA cache) to multiples of 256 cells (llama-context.cpp:
# `GGML_PAD(cparams.n_ctx, 256)`); chosen contexts are multiples of 1024 so they read well.
CTX_PAD = 256
CTX_STEP = 1024
# llama.cpp's own defaults for n_batch / n_ubatch (common/common.h): 2048 / 512.
DEFAULT_N_BATCH = 2048
DEFAULT_N_UBATCH = 512
# ggml backends only offload a CPU-resident matmul to the GPU (copying its weight into the GPU
# compute buffer) for batches of at least 32 tokens (ggml-cuda `offload_op`: batch >= 32).
OP_OFFLOAD_MIN_BATCH = 32

# Memory held by the GPU runtime itself, outside the buffers llama.cpp reports: the CUDA context
# and cuBLAS/pool workspaces take roughly 250-400 MiB on Turing/Ampere laptops with CUDA 12 (as
# reported in llama.cpp and Ollama issues about first-load OOMs); the Vulkan driver (RADV/NVIDIA)
# and ROCm's runtime have their own. Not measurable on this CPU-only build machine: estimates.
GPU_RUNTIME_RESERVE = {"cuda": 384 * MiB, "vulkan": 256 * MiB, "rocm": 512 * MiB, "metal": 0}
# On top of that, a safety margin against fragmentation, other programs growing their VRAM use
# and estimate error: 4 % of the device's memory, at least 192 MiB. llama.cpp's `--fit` keeps
# 1 GiB; ours is smaller because the buffers themselves are computed, not guessed.
GPU_MARGIN_FRACTION = 0.04
GPU_MARGIN_MIN = 192 * MiB
# RAM the process needs besides llama.cpp's buffers: the Python interpreter with llama_cpp,
# localfab and Textual imported measured 62 MiB RSS here; the tokenizer tables of a 262k
# vocabulary add tens of MiB; the rest is headroom for the chat history and the OS.
CPU_RUNTIME_RESERVE = 256 * MiB

# Decode speed: every generated token reads all offloaded weights (and the used part of the KV
# cache) once from each device's memory. llama.cpp reaches roughly 60-80 % of the theoretical
# bandwidth on GPUs and on dual-channel DDR4/DDR5; 70 % is the middle of that range.
BANDWIDTH_EFFICIENCY = 0.7
# The KV cache is read only as far as it is filled; speeds are quoted at a half-full context.
KV_FILL_FOR_SPEED = 0.5
# Used when a device's bandwidth is unknown (the plan says so): a mid-range laptop GPU and
# dual-channel DDR4-2666.
FALLBACK_GPU_BANDWIDTH_GBS = 200.0
FALLBACK_CPU_BANDWIDTH_GBS = 42.7

# ggml types llama.cpp's CPU backend repacks on AVX2/NEON (ggml-cpu/repack.cpp,
# `ggml_repack_get_optimal_repack_type`); only matrices with rows in multiples of 8.
_REPACK_TYPES = frozenset(
    int(GGMLQuantizationType[name])
    for name in ("Q4_0", "Q4_K", "IQ4_NL", "MXFP4")
    if name in GGMLQuantizationType.__members__
)

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

REBUILD = {
    "cuda": 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python",
    "vulkan": 'CMAKE_ARGS="-DGGML_VULKAN=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python",
    "rocm": 'CMAKE_ARGS="-DGGML_HIP=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python",
}


class DoesNotFit(LocalfabError):
    """The model does not fit in this machine's memory even with the smallest plan."""

    exit_code = EXIT_FIT


# --- the result --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceMemory:
    """What the plan puts on one device, in bytes; `available` is its free memory before."""

    device: str  # "CPU" or the GPU's name
    kind: str  # "cpu", "cuda", "vulkan", "rocm"
    available: int
    weights: int
    kv: int
    compute: int
    reserve: int
    unified_memory: bool = False

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.reserve

    @property
    def free_left(self) -> int:
        return self.available - self.total

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "kind": self.kind,
            "unified_memory": self.unified_memory,
            "available": self.available,
            "weights": self.weights,
            "kv": self.kv,
            "compute": self.compute,
            "reserve": self.reserve,
            "total": self.total,
            "free_left": self.free_left,
        }


@dataclass(frozen=True)
class Plan:
    """How to load one model on one machine, and why."""

    model: str
    arch: str
    n_layer: int
    n_gpu_layers: int  # llama.cpp's meaning: output layer + (n_gpu_layers - 1) repeating layers
    n_ctx: int
    type_k: str
    type_v: str
    flash_attn: bool
    swa_full: bool
    n_batch: int
    n_ubatch: int
    threads: int
    threads_batch: int
    op_offload: bool
    gpu: str | None  # the GPU the plan offloads to, None for a CPU plan
    gpu_kind: str | None
    memory: tuple[DeviceMemory, ...]
    fits: bool
    predicted_tok_s: float
    bytes_per_token_gpu: int
    bytes_per_token_cpu: int
    step: str  # which rung of the policy decided: "all-gpu", "kv-q8_0", "ctx", "partial", ...
    reasons: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    costs: tuple[str, ...] = ()  # what explicit overrides cost against the automatic plan
    rebuild: str | None = None
    assumptions: tuple[str, ...] = field(default=(), compare=False)

    @property
    def repeating_layers_on_gpu(self) -> int:
        return max(0, min(self.n_gpu_layers, self.n_layer + 1) - 1)

    @property
    def output_on_gpu(self) -> bool:
        return self.n_gpu_layers >= 1

    @property
    def all_on_gpu(self) -> bool:
        return self.n_gpu_layers >= self.n_layer + 1

    @property
    def partial(self) -> bool:
        """Some but not all layers on the GPU."""
        return 0 < self.n_gpu_layers < self.n_layer + 1

    def device_memory(self, device: str) -> DeviceMemory | None:
        return next((m for m in self.memory if m.device == device), None)

    def require_fit(self) -> Plan:
        """This plan, or `DoesNotFit` saying what is short and what to try."""
        if not self.fits:
            raise DoesNotFit("; ".join(self.warnings) or f"{self.model} does not fit")
        return self

    def settings_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `localfab.engine.EngineSettings`."""
        return {
            "n_ctx": self.n_ctx,
            "n_gpu_layers": self.n_gpu_layers,
            "n_threads": self.threads,
            "n_threads_batch": self.threads_batch,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "flash_attn": "on" if self.flash_attn else "off",
            "type_k": self.type_k,
            "type_v": self.type_v,
            "swa_full": self.swa_full,
            "op_offload": self.op_offload,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: memory in bytes per device and per kind."""
        by_kind = {
            kind: sum(getattr(m, kind) for m in self.memory)
            for kind in ("weights", "kv", "compute", "reserve")
        }
        return {
            "model": self.model,
            "arch": self.arch,
            "fits": self.fits,
            "step": self.step,
            "n_layer": self.n_layer,
            "n_gpu_layers": self.n_gpu_layers,
            "repeating_layers_on_gpu": self.repeating_layers_on_gpu,
            "output_on_gpu": self.output_on_gpu,
            "gpu": self.gpu,
            "gpu_kind": self.gpu_kind,
            "n_ctx": self.n_ctx,
            "type_k": self.type_k,
            "type_v": self.type_v,
            "flash_attn": self.flash_attn,
            "swa_full": self.swa_full,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "threads": self.threads,
            "threads_batch": self.threads_batch,
            "op_offload": self.op_offload,
            "predicted_tok_s": round(self.predicted_tok_s, 2),
            "bytes_per_token": {"gpu": self.bytes_per_token_gpu, "cpu": self.bytes_per_token_cpu},
            "memory": {m.device: m.to_dict() for m in self.memory},
            "memory_by_kind": by_kind,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "costs": list(self.costs),
            "rebuild": self.rebuild,
            "assumptions": list(self.assumptions),
            "settings": self.settings_kwargs(),
        }


@dataclass(frozen=True, kw_only=True)
class Wishes:
    """What the user asked for. None means "let the planner choose"."""

    n_ctx: int | None = None  # -c
    min_ctx: int = DEFAULT_MIN_CTX  # the planner never lowers the context below this
    max_ctx: int | None = None  # upper bound for a chosen context (default DEFAULT_TARGET_CTX)
    n_gpu_layers: int | None = None  # -ngl; -1 or more than the layers means all
    type_k: str | None = None  # -ctk
    type_v: str | None = None  # -ctv
    flash_attn: str = "auto"  # -fa auto|on|off
    n_batch: int | None = None
    n_ubatch: int | None = None
    threads: int | None = None
    swa_full: bool = True  # full-size sliding-window cache, so Gemma's KV cache can be shifted

    @property
    def has_overrides(self) -> bool:
        return any(v is not None for v in (self.n_ctx, self.n_gpu_layers, self.type_k, self.type_v))


# --- memory model ------------------------------------------------------------------------------


def pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _row_bytes(type_name: str, n: int) -> int:
    qtype = GGMLQuantizationType[type_name.upper()]
    block, size = GGML_QUANT_SIZES[qtype]
    if n % block:
        raise UsageError(f"KV type {type_name} needs head sizes in multiples of {block}")
    return n // block * size


def kv_cells(facts: ModelFacts, n_ctx: int, *, n_ubatch: int, swa_full: bool) -> tuple[int, int]:
    """Cells of the full-attention cache and of the sliding-window cache."""
    base = pad(max(n_ctx, 1), CTX_PAD)
    if not facts.sliding_window or not any(facts.swa_layers) or swa_full:
        return base, base
    return base, pad(min(base, facts.sliding_window + n_ubatch), CTX_PAD)


def kv_layer_bytes(
    facts: ModelFacts,
    il: int,
    cells: int,
    *,
    type_k: str,
    type_v: str,
    flash_attn: bool,
) -> int:
    """Bytes of layer `il`'s K and V cache for `cells` cells."""
    n_k = facts.head_kv(il) * facts.key_length
    # without flash attention V is stored transposed, padded to the widest layer
    if flash_attn:
        n_v = facts.head_kv(il) * facts.value_length
    else:
        n_v = _max_head_kv(facts) * facts.value_length
    return (_row_bytes(type_k, n_k) + _row_bytes(type_v, n_v)) * cells


def _max_head_kv(facts: ModelFacts) -> int:
    return facts.n_head_kv if isinstance(facts.n_head_kv, int) else max(facts.n_head_kv)


def _max_head(facts: ModelFacts) -> int:
    return facts.n_head if isinstance(facts.n_head, int) else max(facts.n_head)


def _max_ff(facts: ModelFacts) -> int:
    if facts.n_ff is None:
        return 4 * facts.n_embd
    return facts.n_ff if isinstance(facts.n_ff, int) else max(facts.n_ff)


@dataclass(frozen=True)
class ComputePhases:
    """Peak bytes of the three phases of the worst-case graph (n_ubatch tokens)."""

    attention: int
    feed_forward: int
    logits: int

    @property
    def peak(self) -> int:
        return max(self.attention, self.feed_forward, self.logits)

    @property
    def layers_peak(self) -> int:
        return max(self.attention, self.feed_forward)


def compute_phases(
    facts: ModelFacts, n_ctx: int, *, n_ubatch: int, flash_attn: bool, swa_full: bool
) -> ComputePhases:
    """The compute-buffer model, from llama.cpp's graph (llama-graph.cpp `build_attn_mha`).

    - residual stream and the current hidden state: 2 × n_embd × n_ubatch f32;
    - KQ masks are graph inputs alive through every layer: one [n_kv, n_ubatch] per cache
      (two with sliding-window layers), f16 with flash attention, f32 without;
    - without flash attention the KQ scores [n_kv, n_ubatch, n_head] f32 (softmax in place);
    - feed-forward: gate, up and activation, 3 × n_ff × n_ubatch f32;
    - logits: the reserve graph asks for every token's output, n_vocab × n_ubatch f32 (262k
      vocabularies make this the peak), plus one more hidden state without flash attention.
    Checked against llama.cpp's reported CPU compute buffer for Gemma 3 270M (exact to the
    rounding of its log for the logits phase, within 1 % for the attention phase).
    """
    f32 = 4
    n_ub = n_ubatch
    base, swa = kv_cells(facts, n_ctx, n_ubatch=n_ubatch, swa_full=swa_full)
    mask_elem = 2 if flash_attn else 4
    has_swa = bool(facts.sliding_window) and any(facts.swa_layers)
    masks = base * n_ub * mask_elem + (swa * n_ub * mask_elem if has_swa else 0)
    resid = 2 * facts.n_embd * n_ub * f32
    heads, heads_kv = _max_head(facts), _max_head_kv(facts)
    qkv = (heads * facts.key_length + heads_kv * (facts.key_length + facts.value_length)) * n_ub
    attn_out = heads * facts.value_length * n_ub
    kq = 0 if flash_attn else max(base, swa) * n_ub * heads * f32
    attention = masks + kq + (qkv + attn_out) * f32 + resid
    feed_forward = masks + resid + 3 * _max_ff(facts) * n_ub * f32
    logits = facts.n_vocab * n_ub * f32 + resid + (0 if flash_attn else facts.n_embd * n_ub * f32)
    return ComputePhases(attention=attention, feed_forward=feed_forward, logits=logits)


@lru_cache(maxsize=64)
def _repack_bytes(facts: ModelFacts) -> tuple[tuple[int, ...], int]:
    """Per-layer and output bytes that llama.cpp's CPU backend repacks (a second copy)."""
    per_layer = [0] * facts.n_layer
    output = 0
    for t in facts.tensors:
        if t.ggml_type not in _REPACK_TYPES or len(t.shape) < 2 or t.shape[1] % 8:
            continue
        if t.name.startswith("blk."):
            il = int(t.name.split(".")[1])
            if il < facts.n_layer:
                per_layer[il] += t.nbytes
        elif t.name == "output.weight":
            output += t.nbytes
    return tuple(per_layer), output


@lru_cache(maxsize=64)
def _largest_matrix(facts: ModelFacts, first_gpu_layer: int, output_on_gpu: bool) -> int:
    """Largest CPU-resident matmul weight: what op offload copies into the GPU compute buffer."""
    biggest = 0
    for t in facts.tensors:
        if len(t.shape) < 2:
            continue
        if t.name.startswith("blk."):
            if int(t.name.split(".")[1]) < first_gpu_layer:
                biggest = max(biggest, t.nbytes)
        elif t.name == "output.weight" and not output_on_gpu:
            biggest = max(biggest, t.nbytes)
    if not output_on_gpu and facts.output_tied:
        biggest = max(biggest, facts.token_embd_bytes)
    return biggest


@dataclass(frozen=True)
class Estimate:
    """Memory and speed of one concrete configuration."""

    memory: tuple[DeviceMemory, ...]
    gpu_fits: bool
    cpu_fits: bool
    shortfall: str | None  # what does not fit, in words
    bytes_per_token_gpu: int
    bytes_per_token_cpu: int
    tok_s: float
    op_offload: bool

    @property
    def fits(self) -> bool:
        return self.gpu_fits and self.cpu_fits


def gpu_reserve(device: Device) -> int:
    """Runtime reserve plus safety margin kept free on a GPU (see the constants above)."""
    runtime = GPU_RUNTIME_RESERVE.get(device.kind, 256 * MiB)
    return runtime + max(GPU_MARGIN_MIN, int(device.total * GPU_MARGIN_FRACTION))


def estimate(
    facts: ModelFacts,
    machine: Machine,
    *,
    gpu: Device | None,
    n_gpu_layers: int,
    n_ctx: int,
    type_k: str = "f16",
    type_v: str = "f16",
    flash_attn: bool = True,
    n_ubatch: int = DEFAULT_N_UBATCH,
    swa_full: bool = True,
) -> Estimate:
    """Per-device memory, fit and decode speed of one configuration."""
    n_layer = facts.n_layer
    ngl = 0 if gpu is None else max(0, min(n_gpu_layers, n_layer + 1))
    first_gpu_layer = n_layer + 1 - ngl if ngl else n_layer  # layers >= this are on the GPU
    output_on_gpu = ngl >= 1
    on_gpu = [il >= first_gpu_layer for il in range(n_layer)]
    base_cells, swa_cells = kv_cells(facts, n_ctx, n_ubatch=n_ubatch, swa_full=swa_full)

    # weights
    repack_layers, repack_output = (
        _repack_bytes(facts) if machine.cpu.repack else ((0,) * n_layer, 0)
    )
    output_weights = facts.output_norm_bytes + (
        facts.token_embd_bytes if facts.output_tied else facts.output_bytes
    )
    gpu_w = sum(b for b, g in zip(facts.layer_bytes, on_gpu, strict=True) if g)
    cpu_w = facts.token_embd_bytes + facts.other_bytes
    cpu_w += sum(
        b + r for b, r, g in zip(facts.layer_bytes, repack_layers, on_gpu, strict=True) if not g
    )
    if output_on_gpu:
        gpu_w += output_weights
    else:
        cpu_w += facts.output_norm_bytes + facts.output_bytes + repack_output

    # KV cache (offload_kqv: each layer's cache lives with the layer)
    gpu_kv = cpu_kv = 0
    gpu_kv_read = cpu_kv_read = 0.0
    fill = max(1, int(n_ctx * KV_FILL_FOR_SPEED))
    for il in range(n_layer):
        swa = facts.swa_layers[il]
        cells = swa_cells if swa else base_cells
        b = kv_layer_bytes(facts, il, cells, type_k=type_k, type_v=type_v, flash_attn=flash_attn)
        read_cells = min(fill, facts.sliding_window) if swa and facts.sliding_window else fill
        read = b * read_cells / cells
        if on_gpu[il]:
            gpu_kv += b
            gpu_kv_read += read
        else:
            cpu_kv += b
            cpu_kv_read += read

    # compute buffers
    phases = compute_phases(
        facts, n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn, swa_full=swa_full
    )
    out_buf = facts.n_vocab * 4  # host logits for one token (llama_context output buffer)
    host_inputs = 2 * facts.n_embd * n_ubatch * 4
    op_offload = gpu is not None and n_ubatch >= OP_OFFLOAD_MIN_BATCH
    gpu_c = 0
    if gpu is not None:
        gpu_c = phases.peak if (ngl or op_offload) else 0
        if op_offload and ngl < n_layer + 1:
            gpu_c += _largest_matrix(facts, first_gpu_layer, output_on_gpu)
        if ngl == 0 and op_offload and gpu_c + gpu_reserve(gpu) > gpu.free:
            # the GPU cannot even hold the buffer for offloaded prompt matmuls: keep it idle
            op_offload, gpu_c = False, 0
    if gpu is None or (ngl == 0 and not op_offload):
        cpu_c = phases.peak + out_buf
    else:
        cpu_layers = first_gpu_layer > 0  # some repeating layers run on the CPU
        cpu_c = out_buf + (phases.layers_peak if cpu_layers else host_inputs)
        if not output_on_gpu and not op_offload:
            cpu_c = out_buf + phases.peak

    memory: list[DeviceMemory] = []
    shortfall = None
    cpu_reserve = CPU_RUNTIME_RESERVE
    gpu_mem: DeviceMemory | None = None
    if gpu is not None:
        # an idle GPU (nothing offloaded, op offload off) holds nothing
        used_gpu = ngl > 0 or gpu_c > 0
        gpu_mem = DeviceMemory(
            device=gpu.name,
            kind=gpu.kind,
            available=gpu.free,
            weights=gpu_w,
            kv=gpu_kv,
            compute=gpu_c,
            reserve=gpu_reserve(gpu) if used_gpu else 0,
            unified_memory=gpu.unified_memory,
        )
        if gpu_mem.free_left < 0:
            shortfall = (
                f"{gpu.name} needs {fmt_bytes(gpu_mem.total)} but has {fmt_bytes(gpu.free)} free"
            )
    cpu_available = machine.ram_available
    if gpu_mem is not None and gpu is not None and gpu.unified_memory:
        # GTT is system RAM: what the iGPU takes beyond its carve-out comes out of free RAM
        cpu_available -= max(0, gpu_mem.total - gpu.vram_free)
    cpu_mem = DeviceMemory(
        device="CPU",
        kind="cpu",
        available=cpu_available,
        weights=cpu_w,
        kv=cpu_kv,
        compute=cpu_c,
        reserve=cpu_reserve,
    )
    if cpu_mem.free_left < 0 and shortfall is None:
        what = "RAM (after the iGPU's share)" if gpu is not None and gpu.unified_memory else "RAM"
        shortfall = (
            f"{what} needs {fmt_bytes(cpu_mem.total)} but has {fmt_bytes(cpu_available)} free"
        )
    memory.append(cpu_mem)
    if gpu_mem is not None:
        memory.insert(0, gpu_mem)

    # decode speed: each device streams its share of the weights and the filled KV per token
    gpu_bytes = gpu_w + gpu_kv_read if gpu is not None else 0
    # on the CPU, repacked copies are read instead of the mapped originals, and the token
    # embedding is only indexed (one row per token)
    cpu_bytes = sum(b for b, g in zip(facts.layer_bytes, on_gpu, strict=True) if not g)
    if not output_on_gpu:
        cpu_bytes += facts.output_norm_bytes + (
            facts.token_embd_bytes if facts.output_tied else facts.output_bytes
        )
    cpu_bytes = int(cpu_bytes + cpu_kv_read)
    gpu_bw = _gpu_bandwidth(gpu, machine) * 1e9 * BANDWIDTH_EFFICIENCY if gpu else 1.0
    cpu_bw = _cpu_bandwidth(machine) * 1e9 * BANDWIDTH_EFFICIENCY
    seconds = (gpu_bytes / gpu_bw if gpu_bytes else 0.0) + cpu_bytes / cpu_bw
    tok_s = 1.0 / seconds if seconds > 0 else math.inf
    return Estimate(
        memory=tuple(memory),
        gpu_fits=gpu_mem is None or gpu_mem.free_left >= 0,
        cpu_fits=cpu_mem.free_left >= 0,
        shortfall=shortfall,
        bytes_per_token_gpu=int(gpu_bytes),
        bytes_per_token_cpu=int(cpu_bytes),
        tok_s=tok_s,
        op_offload=op_offload,
    )


def _gpu_bandwidth(gpu: Device, machine: Machine) -> float:
    if gpu.bandwidth_gbs:
        return gpu.bandwidth_gbs
    if gpu.unified_memory:
        return _cpu_bandwidth(machine)
    return FALLBACK_GPU_BANDWIDTH_GBS


def _cpu_bandwidth(machine: Machine) -> float:
    return machine.cpu.bandwidth_gbs or FALLBACK_CPU_BANDWIDTH_GBS


# --- the planner -------------------------------------------------------------------------------


def fmt_bytes(n: float) -> str:
    """1.5 GiB / 340 MiB: binary units, as llama.cpp and nvidia-smi print them."""
    if abs(n) >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def _check_kv_type(name: str, flag: str) -> str:
    name = name.lower()
    if name not in KV_CACHE_TYPES:
        raise UsageError(
            f"{flag} {name}: unknown KV cache type; use one of {', '.join(KV_CACHE_TYPES)}"
        )
    return name


def _pick_gpu(machine: Machine) -> Device | None:
    usable = machine.usable_devices()
    return max(usable, key=lambda d: d.free) if usable else None


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
        result = replace(result, costs=tuple(_costs(result, auto, wishes)))
    return result


def _plan(facts: ModelFacts, machine: Machine, wishes: Wishes) -> Plan:
    reasons: list[str] = []
    warnings: list[str] = []
    assumptions: list[str] = []
    n_layer = facts.n_layer
    full = n_layer + 1

    # flash attention and KV types ------------------------------------------------------------
    fa_wish = wishes.flash_attn.lower()
    if fa_wish not in ("auto", "on", "off"):
        raise UsageError(f"-fa {wishes.flash_attn}: use auto, on or off")
    flash_attn = fa_wish != "off"
    type_k = _check_kv_type(wishes.type_k, "-ctk") if wishes.type_k else None
    type_v = _check_kv_type(wishes.type_v, "-ctv") if wishes.type_v else None
    if not flash_attn and type_v not in (None, "f16", "f32", "bf16"):
        raise UsageError(
            f"-ctv {type_v} needs flash attention (llama.cpp cannot quantize the V cache "
            f"without it): drop -fa off or use -ctv f16"
        )
    if type_k or type_v:
        kv_ladder = [(type_k or "f16", type_v or "f16")]
    else:
        kv_ladder = [("f16", "f16")] + ([("q8_0", "q8_0")] if flash_attn else [])

    n_ubatch = wishes.n_ubatch or DEFAULT_N_UBATCH
    n_batch = max(wishes.n_batch or DEFAULT_N_BATCH, n_ubatch)
    if wishes.n_batch and wishes.n_batch < n_ubatch:
        n_ubatch = wishes.n_batch
        n_batch = wishes.n_batch

    # context ---------------------------------------------------------------------------------
    n_ctx_train = facts.n_ctx_train or DEFAULT_TARGET_CTX
    if wishes.n_ctx:
        if wishes.n_ctx < 1:
            raise UsageError(f"-c {wishes.n_ctx}: the context must be at least 1 token")
        target = floor = wishes.n_ctx
        if wishes.n_ctx > n_ctx_train:
            warnings.append(
                f"-c {wishes.n_ctx} is beyond the {n_ctx_train} tokens the model was trained on: "
                f"expect worse answers past {n_ctx_train} tokens"
            )
    else:
        target = min(n_ctx_train, wishes.max_ctx or DEFAULT_TARGET_CTX)
        floor = min(max(wishes.min_ctx, 1), target)

    # device ----------------------------------------------------------------------------------
    gpu = _pick_gpu(machine)
    rebuild = None
    unusable = [d for d in machine.devices if d not in machine.usable_devices()]
    if gpu is None and unusable:
        d = unusable[0]
        kind = "cuda" if d.vendor == "nvidia" else "vulkan"
        rebuild = REBUILD[kind]
        have = machine.backend.label
        reasons.append(
            f"{d.name} is present, but the installed llama-cpp-python was built for {have}, so "
            f"this plan runs on the CPU. To use the GPU, rebuild it: {rebuild}"
        )
    if machine.backend.error:
        warnings.append(f"could not ask llama-cpp-python for its backends: {machine.backend.error}")
    others = [d for d in machine.usable_devices() if d is not gpu]
    if others:
        reasons.append(
            f"Planning for {gpu.name if gpu else '?'} only; "
            f"{', '.join(d.name for d in others)} not used (one GPU per plan)."
        )

    ngl_fixed: int | None = None
    if wishes.n_gpu_layers is not None:
        ngl_fixed = full if wishes.n_gpu_layers < 0 else min(wishes.n_gpu_layers, full)
        if gpu is None and ngl_fixed > 0:
            warnings.append(f"-ngl {wishes.n_gpu_layers} ignored: no GPU this build can use")
            ngl_fixed = 0

    def est(
        ngl: int, ctx: int, kv: tuple[str, str], *, swa_full: bool = wishes.swa_full
    ) -> Estimate:
        return estimate(
            facts,
            machine,
            gpu=gpu,
            n_gpu_layers=ngl,
            n_ctx=ctx,
            type_k=kv[0],
            type_v=kv[1],
            flash_attn=flash_attn,
            n_ubatch=n_ubatch,
            swa_full=swa_full,
        )

    top = full if gpu is not None else 0
    ngl_try = ngl_fixed if ngl_fixed is not None else top
    where = f"on {gpu.name}" if gpu is not None and ngl_try == full else "in memory"
    if gpu is not None and 0 < ngl_try < full:
        where = f"with {ngl_try} layers on {gpu.name}"

    chosen: tuple[int, int, tuple[str, str]] | None = None
    step = ""
    # 1. everything at the target context, f16 then q8_0 cache
    for i, kv in enumerate(kv_ladder):
        e = est(ngl_try, target, kv)
        if e.fits:
            chosen, step = (ngl_try, target, kv), ("fits" if i == 0 else "kv-" + kv[0])
            if i > 0:
                f16 = est(ngl_try, target, kv_ladder[0])
                reasons.append(
                    f"An f16 KV cache for {target} tokens does not fit {where} "
                    f"({f16.shortfall}); a {kv[0]} cache takes {fmt_bytes(_kv_total(e))} instead "
                    f"of {fmt_bytes(_kv_total(f16))}, with little loss in quality "
                    f"(it needs flash attention, which is on)."
                )
            break
    # 2. lower the context toward the floor, with the most compact cache
    if chosen is None and floor < target:
        kv = kv_ladder[-1]
        best = _largest_ctx(lambda c: est(ngl_try, c, kv).fits, floor, target)
        if best is not None:
            chosen, step = (ngl_try, best, kv), "ctx"
            reasons.append(
                f"{target} tokens do not fit {where} even with a {kv[0]} cache; the context is "
                f"lowered to {best} tokens (the floor is {floor})."
            )
    # 3. partial offload at the floor
    if chosen is None and gpu is not None and ngl_fixed is None:
        kv = kv_ladder[-1]
        # GPU memory grows with -ngl and CPU memory shrinks: take the most the GPU holds, then
        # check the CPU side at that point (fewer layers on the GPU would only need more RAM)
        lo = _largest_ngl(lambda n: est(n, floor, kv).gpu_fits, full - 1)
        if lo is not None and not est(lo, floor, kv).cpu_fits:
            lo = None
        if lo is not None:
            chosen, step = (lo, floor, kv), "partial"
            rep = max(0, lo - 1)
            if lo == 0:
                reasons.append(
                    f"Not even the output layer fits on {gpu.name} beside the compute buffer at "
                    f"{floor} tokens; the model runs on the CPU."
                )
            else:
                whole = est(full, floor, kv)
                reasons.append(
                    f"At the {floor}-token floor with a {kv[0]} cache the whole model does not fit "
                    f"({whole.shortfall}): -ngl {lo} puts the output layer and the last {rep} of "
                    f"{n_layer} repeating layers on the GPU; the other {n_layer - rep} run on the "
                    f"CPU from RAM and slow decoding down."
                )
    fits = chosen is not None
    if chosen is None:
        kv = kv_ladder[-1]
        ngl_c = ngl_try
        chosen, step = (ngl_c, floor, kv), "does-not-fit"
        e = est(ngl_c, floor, kv)
        warnings.append(
            f"{_model_name(facts)} does not fit even at {floor} tokens with a {kv[0]} cache: "
            f"{e.shortfall}. Close other programs, pick a smaller model or quant, or lower the "
            f"context with -c (at your own risk below {floor})"
        )
    ngl, n_ctx, kv = chosen
    final = est(ngl, n_ctx, kv)

    # reasons for the rest ------------------------------------------------------------------------
    if fits and step == "fits":
        if gpu is not None and ngl == full:
            reasons.insert(
                0,
                f"All {n_layer} layers and the output layer fit on {gpu.name} with a "
                f"{n_ctx}-token context and a {kv[0]}/{kv[1]} KV cache.",
            )
        elif gpu is None:
            reasons.insert(0, f"The model runs on the CPU with a {n_ctx}-token context.")
    if ngl_fixed is not None:
        reasons.append(f"-ngl {wishes.n_gpu_layers} as you asked.")
    if wishes.n_ctx:
        reasons.append(f"-c {wishes.n_ctx} as you asked.")
    if type_k or type_v:
        reasons.append(f"KV cache {kv[0]}/{kv[1]} as you asked.")
    if n_ctx < target and step == "partial":
        pass  # already explained
    if gpu is not None and gpu.unified_memory:
        carve = fmt_bytes(gpu.vram_total or 0)
        gtt = fmt_bytes(gpu.gtt_total or 0)
        reasons.append(
            f"{gpu.name} is an integrated GPU sharing system RAM ({carve} carve-out + {gtt} GTT "
            f"via {gpu.kind}); what it takes beyond the carve-out comes out of the "
            f"{fmt_bytes(machine.ram_available)} of free RAM. Offloading to it speeds up prompt "
            f"processing much more than decoding, which reads the same RAM at the same "
            f"bandwidth either way."
        )
    if facts.sliding_window and any(facts.swa_layers):
        n_swa = sum(facts.swa_layers)
        if wishes.swa_full:
            small = est(ngl, n_ctx, kv, swa_full=False)
            extra = _kv_total(final) - _kv_total(small)
            if extra > 0:
                reasons.append(
                    f"{n_swa} of {n_layer} layers use a {facts.sliding_window}-token sliding "
                    f"window; their cache is kept full-size (swa_full) so the KV cache can be "
                    f"shifted when a chat outgrows the context, which costs {fmt_bytes(extra)}."
                )
        else:
            reasons.append(
                f"{n_swa} of {n_layer} layers use a {facts.sliding_window}-token sliding window "
                f"and keep only the window (swa_full off): the KV cache cannot be shifted."
            )
    reasons.append(
        "Flash attention on: it shrinks the compute buffer and allows a quantized KV cache."
        if flash_attn
        else "Flash attention off, as you asked: the KV cache stays f16 and the compute buffer "
        "grows with the context."
    )
    phases = compute_phases(
        facts, n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn, swa_full=wishes.swa_full
    )
    if phases.logits >= phases.layers_peak and facts.n_vocab >= 100_000:
        reasons.append(
            f"n_ubatch {n_ubatch}, n_batch {n_batch}: the {facts.n_vocab:,}-token vocabulary "
            f"makes the compute buffer {fmt_bytes(phases.peak)} (logits for {n_ubatch} tokens); "
            f"a smaller n_ubatch shrinks it at some cost in prompt speed."
        )
    else:
        reasons.append(f"n_ubatch {n_ubatch}, n_batch {n_batch} (llama.cpp's defaults).")

    threads = wishes.threads or max(1, machine.cpu.physical_cores)
    note = "as you asked" if wishes.threads else "one per physical core; hyper-threads do not help"
    if (
        not wishes.threads
        and machine.cpu.performance_cores
        and machine.cpu.performance_cores < machine.cpu.physical_cores
    ):
        note += (
            f" (this CPU has {machine.cpu.performance_cores} performance cores; if decoding "
            f"stutters, try --threads {machine.cpu.performance_cores})"
        )
    reasons.append(f"{threads} CPU threads: {note}.")

    gpu_bw = _gpu_bandwidth(gpu, machine) if gpu else None
    cpu_bw = _cpu_bandwidth(machine)
    parts = []
    if final.bytes_per_token_gpu:
        parts.append(
            f"{fmt_bytes(final.bytes_per_token_gpu)} from {gpu.name if gpu else 'GPU'} "
            f"({gpu_bw:.0f} GB/s)"
        )
    if final.bytes_per_token_cpu:
        parts.append(f"{fmt_bytes(final.bytes_per_token_cpu)} from RAM ({cpu_bw:.0f} GB/s)")
    reasons.append(
        f"Predicted decoding ≈ {final.tok_s:.0f} tok/s: each token reads "
        f"{' and '.join(parts) or 'nothing'} at about {BANDWIDTH_EFFICIENCY:.0%} of the "
        f"theoretical bandwidth, with the context half full."
    )
    if gpu is not None and not gpu.bandwidth_gbs and not gpu.unified_memory:
        assumptions.append(
            f"bandwidth of {gpu.name} unknown: assumed {FALLBACK_GPU_BANDWIDTH_GBS:.0f} GB/s"
        )
    if not machine.cpu.bandwidth_gbs:
        assumptions.append(f"RAM bandwidth unknown: assumed {FALLBACK_CPU_BANDWIDTH_GBS} GB/s")
    if ngl_fixed is not None and not final.fits:
        warnings.append(
            f"-ngl {wishes.n_gpu_layers} will likely run out of memory: {final.shortfall}"
        )

    return Plan(
        model=_model_name(facts),
        arch=facts.arch,
        n_layer=n_layer,
        n_gpu_layers=ngl if gpu is not None else 0,
        n_ctx=n_ctx,
        type_k=kv[0],
        type_v=kv[1],
        flash_attn=flash_attn,
        swa_full=wishes.swa_full,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
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
        rebuild=rebuild,
        assumptions=tuple(assumptions),
    )


def _kv_total(e: Estimate) -> int:
    return sum(m.kv for m in e.memory)


def _model_name(facts: ModelFacts) -> str:
    return facts.name or facts.arch


def _largest_ctx(fits: Any, floor: int, target: int) -> int | None:
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


def _largest_ngl(fits: Any, top: int) -> int | None:
    """Largest n_gpu_layers in [0, top] that fits (GPU memory grows with it)."""
    lo, hi, best = 0, top, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _gpu_total(p: Plan) -> int:
    mem = p.device_memory(p.gpu) if p.gpu else None
    return mem.total if mem is not None else 0


def _costs(p: Plan, auto: Plan, wishes: Wishes) -> Iterable[str]:
    """What the user's explicit choices cost against the plan localfab would have made."""
    asked = []
    if wishes.n_ctx is not None:
        asked.append(f"-c {wishes.n_ctx}")
    if wishes.n_gpu_layers is not None:
        asked.append(f"-ngl {wishes.n_gpu_layers}")
    if wishes.type_k is not None:
        asked.append(f"-ctk {wishes.type_k}")
    if wishes.type_v is not None:
        asked.append(f"-ctv {wishes.type_v}")
    kv_p = sum(m.kv for m in p.memory)
    kv_a = sum(m.kv for m in auto.memory)
    gpu_p = _gpu_total(p)
    gpu_a = _gpu_total(auto)
    yield (
        f"{' '.join(asked)}: {p.n_ctx} tokens with a {p.type_k}/{p.type_v} cache "
        f"({fmt_bytes(kv_p)}) and -ngl {p.n_gpu_layers}, against the automatic plan's "
        f"{auto.n_ctx} tokens, {auto.type_k}/{auto.type_v} ({fmt_bytes(kv_a)}) and "
        f"-ngl {auto.n_gpu_layers}."
    )
    if p.gpu:
        yield f"GPU memory: {fmt_bytes(gpu_p)} against {fmt_bytes(gpu_a)}."
    if abs(p.predicted_tok_s - auto.predicted_tok_s) >= 0.5:
        yield (
            f"Predicted decoding ≈ {p.predicted_tok_s:.0f} tok/s against "
            f"{auto.predicted_tok_s:.0f} tok/s."
        )
    if not p.fits and auto.fits:
        yield "Your choices do not fit this machine; the automatic plan does."
