"""The offload planner: (model facts, machine, wishes) -> plan, as a pure function.

It decides how many layers go on the GPU (llama.cpp's `n_gpu_layers`, which counts the output
layer as one), the context size, the KV cache types, flash attention, batch sizes and threads,
and explains each choice. Three parts, each readable on its own:

- `memory`: what llama.cpp allocates for one configuration (weights, KV cache, compute
  buffers per device) and how fast it decodes;
- `policy`: which configuration to load (resolve the wishes, pick the device, search);
- `explain`: the reasons, warnings and costs a user reads.

`result` holds the values that cross the boundary: `Wishes` in, `Plan` out.
"""

from __future__ import annotations

from localfab.plan.kv_types import KV, KvCacheType, check_kv_type
from localfab.plan.memory import (
    BANDWIDTH_EFFICIENCY,
    CPU_RUNTIME_RESERVE,
    CTX_PAD,
    CTX_STEP,
    DEFAULT_N_BATCH,
    DEFAULT_N_UBATCH,
    FALLBACK_CPU_BANDWIDTH_GBS,
    FALLBACK_GPU_BANDWIDTH_GBS,
    GPU_MARGIN_FRACTION,
    GPU_MARGIN_MIN,
    GPU_RUNTIME_RESERVE,
    KV_FILL_FOR_SPEED,
    OP_OFFLOAD_MIN_BATCH,
    ComputePhases,
    Estimate,
    compute_phases,
    estimate,
    gpu_reserve,
    kv_cells,
    kv_layer_bytes,
    pad,
)
from localfab.plan.policy import REBUILD, plan
from localfab.plan.result import (
    DEFAULT_MIN_CTX,
    DEFAULT_TARGET_CTX,
    DeviceMemory,
    DoesNotFit,
    Plan,
    Wishes,
)
from localfab.units import KV_CACHE_TYPES, GiB, MiB

__all__ = [
    "BANDWIDTH_EFFICIENCY",
    "CPU_RUNTIME_RESERVE",
    "CTX_PAD",
    "CTX_STEP",
    "DEFAULT_MIN_CTX",
    "DEFAULT_N_BATCH",
    "DEFAULT_N_UBATCH",
    "DEFAULT_TARGET_CTX",
    "FALLBACK_CPU_BANDWIDTH_GBS",
    "FALLBACK_GPU_BANDWIDTH_GBS",
    "GPU_MARGIN_FRACTION",
    "GPU_MARGIN_MIN",
    "GPU_RUNTIME_RESERVE",
    "KV",
    "KV_CACHE_TYPES",
    "KV_FILL_FOR_SPEED",
    "OP_OFFLOAD_MIN_BATCH",
    "REBUILD",
    "ComputePhases",
    "DeviceMemory",
    "DoesNotFit",
    "Estimate",
    "GiB",
    "MiB",
    "KvCacheType",
    "Plan",
    "Wishes",
    "check_kv_type",
    "compute_phases",
    "estimate",
    "gpu_reserve",
    "kv_cells",
    "kv_layer_bytes",
    "pad",
    "plan",
]
