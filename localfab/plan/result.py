"""What the planner takes and gives: the user's `Wishes`, the `Plan` and its per-device memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from localfab.errors import EXIT_FIT, LocalfabError
from localfab.plan.kv_types import KvCacheType

# Context the planner aims for when the user gives none: long enough for multi-turn chats with a
# pasted document, short enough that an 8B model's cache does not crowd out its weights on a
# 6 GB card. Never above the model's training context.
DEFAULT_TARGET_CTX = 16384
# The floor the planner lowers the context to before it moves layers off the GPU (issue 3).
DEFAULT_MIN_CTX = 4096


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
    type_k: KvCacheType
    type_v: KvCacheType
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
    # RAM the prompt cache may hold (idle conversations' KV states): half of what the load
    # leaves free, at most llama-server's 8 GiB (`prompt_cache_budget`).
    prompt_cache: int = 0

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
            "prompt_cache_ram": self.prompt_cache,
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
