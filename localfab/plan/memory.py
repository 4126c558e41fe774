"""The planner's memory model: what llama.cpp allocates for one configuration, and how fast it
decodes.

References are to the llama.cpp vendored by llama-cpp-python 0.3.36:

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
  sizes llama.cpp reports for Gemma 3 270M (see `tests/plan/test_plan.py`, calibration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from localfab.errors import UsageError
from localfab.gguf.facts import ModelFacts
from localfab.machine.probes import Device, Machine
from localfab.plan.result import DeviceMemory
from localfab.units import MiB, format_bytes

# --- constants, and where they come from -------------------------------------------------------

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
    split = _Split(
        ngl=ngl,
        first_gpu_layer=n_layer + 1 - ngl if ngl else n_layer,  # layers >= this are on the GPU
        output_on_gpu=ngl >= 1,
    )
    on_gpu = split.on_gpu(n_layer)
    gpu_w, cpu_w = _weights(facts, machine, split)
    base_cells, swa_cells = kv_cells(facts, n_ctx, n_ubatch=n_ubatch, swa_full=swa_full)
    kv = _kv_split(facts, on_gpu, n_ctx, base_cells, swa_cells, type_k, type_v, flash_attn)
    phases = compute_phases(
        facts, n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn, swa_full=swa_full
    )
    gpu_c, cpu_c, op_offload = _compute(facts, gpu, split, phases, n_ubatch)
    gpu_mem = None if gpu is None else _gpu_memory(gpu, gpu_w, kv.gpu, gpu_c, used=ngl > 0)
    cpu_mem = _cpu_memory(machine, gpu, gpu_mem, cpu_w, kv.cpu, cpu_c)
    memory = (cpu_mem,) if gpu_mem is None else (gpu_mem, cpu_mem)
    gpu_bytes, cpu_bytes, tok_s = _decode_speed(facts, machine, gpu, split, gpu_w, kv)
    return Estimate(
        memory=memory,
        gpu_fits=gpu_mem is None or gpu_mem.free_left >= 0,
        cpu_fits=cpu_mem.free_left >= 0,
        shortfall=_shortfall(gpu, gpu_mem, cpu_mem),
        bytes_per_token_gpu=int(gpu_bytes),
        bytes_per_token_cpu=int(cpu_bytes),
        tok_s=tok_s,
        op_offload=op_offload,
    )


def _gpu_memory(gpu: Device, weights: int, kv: int, compute: int, *, used: bool) -> DeviceMemory:
    """What the GPU holds; an idle GPU (nothing offloaded, op offload off) holds nothing."""
    return DeviceMemory(
        device=gpu.name,
        kind=gpu.kind,
        available=gpu.free,
        weights=weights,
        kv=kv,
        compute=compute,
        reserve=gpu_reserve(gpu) if used or compute > 0 else 0,
        unified_memory=gpu.unified_memory,
    )


def _cpu_memory(
    machine: Machine,
    gpu: Device | None,
    gpu_mem: DeviceMemory | None,
    weights: int,
    kv: int,
    compute: int,
) -> DeviceMemory:
    """What system RAM holds, against what is free of it."""
    available = machine.ram_available
    if gpu_mem is not None and gpu is not None and gpu.unified_memory:
        # GTT is system RAM: what the iGPU takes beyond its carve-out comes out of free RAM
        available -= max(0, gpu_mem.total - gpu.vram_free)
    return DeviceMemory(
        device="CPU",
        kind="cpu",
        available=available,
        weights=weights,
        kv=kv,
        compute=compute,
        reserve=CPU_RUNTIME_RESERVE,
    )


@dataclass(frozen=True)
class _Split:
    """Where the layers go: the last `ngl` of the repeating layers and the output on the GPU."""

    ngl: int
    first_gpu_layer: int
    output_on_gpu: bool

    def on_gpu(self, n_layer: int) -> list[bool]:
        return [il >= self.first_gpu_layer for il in range(n_layer)]


@dataclass(frozen=True)
class _KVSplit:
    """KV cache bytes per device, and the bytes of it one token reads at the speed's fill."""

    gpu: int
    cpu: int
    gpu_read: float
    cpu_read: float


def _weights(facts: ModelFacts, machine: Machine, split: _Split) -> tuple[int, int]:
    """Weight bytes on the GPU and on the CPU (repacked copies included there)."""
    on_gpu = split.on_gpu(facts.n_layer)
    repack_layers, repack_output = (
        _repack_bytes(facts) if machine.cpu.repack else ((0,) * facts.n_layer, 0)
    )
    output_weights = facts.output_norm_bytes + (
        facts.token_embd_bytes if facts.output_tied else facts.output_bytes
    )
    gpu_w = sum(b for b, g in zip(facts.layer_bytes, on_gpu, strict=True) if g)
    cpu_w = facts.token_embd_bytes + facts.other_bytes
    cpu_w += sum(
        b + r for b, r, g in zip(facts.layer_bytes, repack_layers, on_gpu, strict=True) if not g
    )
    if split.output_on_gpu:
        gpu_w += output_weights
    else:
        cpu_w += facts.output_norm_bytes + facts.output_bytes + repack_output
    return gpu_w, cpu_w


def _kv_split(
    facts: ModelFacts,
    on_gpu: list[bool],
    n_ctx: int,
    base_cells: int,
    swa_cells: int,
    type_k: str,
    type_v: str,
    flash_attn: bool,
) -> _KVSplit:
    """The KV cache per device (offload_kqv: each layer's cache lives with the layer)."""
    gpu_kv = cpu_kv = 0
    gpu_kv_read = cpu_kv_read = 0.0
    fill = max(1, int(n_ctx * KV_FILL_FOR_SPEED))
    for il in range(facts.n_layer):
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
    return _KVSplit(gpu_kv, cpu_kv, gpu_kv_read, cpu_kv_read)


def _compute(
    facts: ModelFacts, gpu: Device | None, split: _Split, phases: ComputePhases, n_ubatch: int
) -> tuple[int, int, bool]:
    """Compute buffers on the GPU and the CPU, and whether prompt matmuls go to the GPU."""
    n_layer, ngl = facts.n_layer, split.ngl
    out_buf = facts.n_vocab * 4  # host logits for one token (llama_context output buffer)
    host_inputs = 2 * facts.n_embd * n_ubatch * 4
    op_offload = gpu is not None and n_ubatch >= OP_OFFLOAD_MIN_BATCH
    gpu_c = 0
    if gpu is not None:
        gpu_c = phases.peak if (ngl or op_offload) else 0
        if op_offload and ngl < n_layer + 1:
            gpu_c += _largest_matrix(facts, split.first_gpu_layer, split.output_on_gpu)
        if ngl == 0 and op_offload and gpu_c + gpu_reserve(gpu) > gpu.free:
            # the GPU cannot even hold the buffer for offloaded prompt matmuls: keep it idle
            op_offload, gpu_c = False, 0
    if gpu is None or (ngl == 0 and not op_offload):
        return gpu_c, phases.peak + out_buf, op_offload
    cpu_layers = split.first_gpu_layer > 0  # some repeating layers run on the CPU
    cpu_c = out_buf + (phases.layers_peak if cpu_layers else host_inputs)
    if not split.output_on_gpu and not op_offload:
        cpu_c = out_buf + phases.peak
    return gpu_c, cpu_c, op_offload


def _shortfall(
    gpu: Device | None, gpu_mem: DeviceMemory | None, cpu_mem: DeviceMemory
) -> str | None:
    """What does not fit, the GPU first; None when everything does."""
    if gpu is not None and gpu_mem is not None and gpu_mem.free_left < 0:
        return (
            f"{gpu.name} needs {format_bytes(gpu_mem.total)} but has {format_bytes(gpu.free)} free"
        )
    if cpu_mem.free_left < 0:
        what = "RAM (after the iGPU's share)" if gpu is not None and gpu.unified_memory else "RAM"
        return (
            f"{what} needs {format_bytes(cpu_mem.total)} "
            f"but has {format_bytes(cpu_mem.available)} free"
        )
    return None


def _decode_speed(
    facts: ModelFacts,
    machine: Machine,
    gpu: Device | None,
    split: _Split,
    gpu_w: int,
    kv: _KVSplit,
) -> tuple[float, int, float]:
    """Bytes each device streams per token and the tok/s they allow: each device streams its
    share of the weights and the filled KV per token."""
    on_gpu = split.on_gpu(facts.n_layer)
    gpu_bytes = gpu_w + kv.gpu_read if gpu is not None else 0
    # on the CPU, repacked copies are read instead of the mapped originals, and the token
    # embedding is only indexed (one row per token)
    cpu_bytes = sum(b for b, g in zip(facts.layer_bytes, on_gpu, strict=True) if not g)
    if not split.output_on_gpu:
        cpu_bytes += facts.output_norm_bytes + (
            facts.token_embd_bytes if facts.output_tied else facts.output_bytes
        )
    cpu_bytes = int(cpu_bytes + kv.cpu_read)
    gpu_bw = gpu_bandwidth(gpu, machine) * 1e9 * BANDWIDTH_EFFICIENCY if gpu else 1.0
    cpu_bw = cpu_bandwidth(machine) * 1e9 * BANDWIDTH_EFFICIENCY
    seconds = (gpu_bytes / gpu_bw if gpu_bytes else 0.0) + cpu_bytes / cpu_bw
    tok_s = 1.0 / seconds if seconds > 0 else math.inf
    return gpu_bytes, cpu_bytes, tok_s


def gpu_bandwidth(gpu: Device, machine: Machine) -> float:
    """The GPU's bandwidth in GB/s: known, the RAM's for an iGPU, else a fallback."""
    if gpu.bandwidth_gbs:
        return gpu.bandwidth_gbs
    if gpu.unified_memory:
        return cpu_bandwidth(machine)
    return FALLBACK_GPU_BANDWIDTH_GBS


def cpu_bandwidth(machine: Machine) -> float:
    """The RAM's bandwidth in GB/s, or a fallback."""
    return machine.cpu.bandwidth_gbs or FALLBACK_CPU_BANDWIDTH_GBS
