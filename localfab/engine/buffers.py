"""What llama.cpp allocates for a load, measured by loading it (the planner's calibration)."""

from __future__ import annotations

from pathlib import Path

from localfab.engine.llama import Engine
from localfab.engine.types import BufferSizes, EngineSettings, FlashAttn


def measure_buffers(
    path: str | Path,
    *,
    n_ctx: int,
    n_ubatch: int = 512,
    n_batch: int | None = None,
    flash_attn: FlashAttn = "auto",
    type_k: str = "f16",
    type_v: str = "f16",
    n_gpu_layers: int = 0,
    swa_full: bool = True,
) -> BufferSizes:
    """Load a model and return the buffer sizes llama.cpp reports (for planner calibration)."""
    settings = EngineSettings(
        n_ctx=n_ctx,
        n_ubatch=n_ubatch,
        n_batch=n_batch or max(n_ubatch, 2048),
        flash_attn=flash_attn,
        type_k=type_k,
        type_v=type_v,
        n_gpu_layers=n_gpu_layers,
        swa_full=swa_full,
    )
    with Engine(path, settings) as engine:
        return engine.buffers
