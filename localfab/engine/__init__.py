"""The runtime layer: one loaded model (the only code that imports llama_cpp).

The data types are importable without loading llama.cpp; `Engine`, `backend_info` and
`measure_buffers` import it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localfab.engine.types import (
    KV_TYPES,
    BufferSizes,
    ChatEngine,
    Done,
    EngineSettings,
    GenerationOptions,
    SamplingParams,
    StopType,
    Timings,
    TokenEvent,
    TokenProbs,
)

if TYPE_CHECKING:
    from localfab.engine.buffers import measure_buffers
    from localfab.engine.llama import Engine, backend_info, physical_cores

__all__ = [
    "KV_TYPES",
    "BufferSizes",
    "ChatEngine",
    "Done",
    "Engine",
    "EngineSettings",
    "GenerationOptions",
    "SamplingParams",
    "StopType",
    "Timings",
    "TokenEvent",
    "TokenProbs",
    "backend_info",
    "measure_buffers",
    "physical_cores",
]

_LAZY = {"Engine", "backend_info", "physical_cores"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from localfab.engine import llama

        return getattr(llama, name)
    if name == "measure_buffers":
        from localfab.engine.buffers import measure_buffers

        return measure_buffers
    raise AttributeError(name)
