"""What a ledger row holds and how a front end builds one: `Row`, `PlanInfo`, `TokenClock`.

The figures (time to first token, token-to-token latency p50/p99, decode tok/s, peak memory) come
from the token clock a front end ticks, or from the engine's timings when it kept none; a
request's text is never part of a row. Nothing here touches the database (`ledger_db` does).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import resource
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from localfab.machine.energy import Energy


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation, as numpy's default; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class TokenClock:
    """Arrival times of a reply's tokens, kept by the caller: one clock read per token."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.tick = self.times.append  # bound once: the per-token cost is one append

    def now(self) -> None:
        self.tick(time.perf_counter())

    @property
    def intervals_ms(self) -> list[float]:
        t = self.times
        return [(b - a) * 1e3 for a, b in zip(t, t[1:], strict=False)]

    def decode_tok_s(self) -> float | None:
        if len(self.times) < 2 or self.times[-1] <= self.times[0]:
            return None
        return (len(self.times) - 1) / (self.times[-1] - self.times[0])


class PlanLike(Protocol):
    n_gpu_layers: int
    n_ctx: int
    type_k: str
    type_v: str


@dataclass(frozen=True)
class PlanInfo:
    """The plan columns of a row, from a `Plan` or an `EngineSettings`."""

    n_gpu_layers: int
    n_ctx: int
    type_k: str
    type_v: str
    flash_attn: str
    threads: int
    spec_mode: str = "off"

    @classmethod
    def of(cls, plan: Any, *, spec_mode: str = "off") -> PlanInfo:
        fa = getattr(plan, "flash_attn", "auto")
        if isinstance(fa, bool):
            fa = "on" if fa else "off"
        threads: Any = getattr(plan, "threads", None)
        if threads is None:
            threads = getattr(plan, "n_threads", 0)
        return cls(
            n_gpu_layers=int(plan.n_gpu_layers),
            n_ctx=int(plan.n_ctx),
            type_k=str(plan.type_k),
            type_v=str(plan.type_v),
            flash_attn=str(fa),
            threads=int(threads),
            spec_mode=spec_mode,
        )

    @property
    def key(self) -> str:
        """A short stable id for `stats --compare`."""
        text = "|".join(str(v) for v in asdict(self).values())
        return "p" + hashlib.sha1(text.encode()).hexdigest()[:6]

    def describe(self) -> str:
        return (
            f"ngl {self.n_gpu_layers}, ctx {self.n_ctx}, kv {self.type_k}/{self.type_v}, "
            f"fa {self.flash_attn}, {self.threads} threads, spec {self.spec_mode}"
        )


@dataclass(frozen=True)
class Row:
    """One generation as the ledger stores it (never the request's text)."""

    frontend: str
    model: str
    plan: PlanInfo
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    ttft_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    decode_tok_s: float | None
    peak_memory: Mapping[str, int] = field(default_factory=dict)
    energy_j: float | None = None
    tokens_per_j: float | None = None
    energy_source: str = ""
    energy_note: str = ""
    model_path: str = ""
    model_size: int | None = None
    model_sha256: str | None = None
    label: str = ""  # a bench baseline's label
    depth: int | None = None  # a bench row's context depth
    at: float = field(default_factory=time.time)

    def columns(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "plan"}
        values |= asdict(self.plan)
        values["plan_key"] = self.plan.key
        values["peak_memory"] = json.dumps(dict(self.peak_memory), sort_keys=True)
        values["day"] = time.strftime("%Y-%m-%d", time.localtime(self.at))
        return values


def timing_fields(clock: TokenClock | None, timings: Any) -> dict[str, float | None]:
    """TTFT, latency p50/p99 and decode tok/s from a clock (preferred) or engine timings."""
    ttft = float(timings.ttft_ms) if timings is not None else None
    if clock is not None and len(clock.times) >= 2:
        gaps = clock.intervals_ms
        return {
            "ttft_ms": ttft,
            "itl_p50_ms": percentile(gaps, 50),
            "itl_p99_ms": percentile(gaps, 99),
            "decode_tok_s": clock.decode_tok_s(),
        }
    per_s = getattr(timings, "predicted_per_second", 0.0) if timings is not None else 0.0
    per_tok = getattr(timings, "predicted_per_token_ms", 0.0) if timings is not None else 0.0
    return {
        "ttft_ms": ttft,
        "itl_p50_ms": per_tok or None,
        "itl_p99_ms": None,
        "decode_tok_s": per_s or None,
    }


def peak_memory(drm_root: str | Path = "/sys/class/drm", nvml: Any | None = None) -> dict[str, int]:
    """Peak memory per device in bytes: this process's peak RSS, and GPU memory in use now
    (llama.cpp allocates its GPU buffers at load, so the use after a reply is its peak)."""
    result = {"ram": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if nvml is not None:
        with contextlib.suppress(Exception):
            for i in range(int(nvml.nvmlDeviceGetCount())):
                info = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i))
                result[f"cuda{i}"] = int(info.used)
    base = Path(drm_root)
    for card in sorted(base.glob("card[0-9]*")) if base.is_dir() else []:
        used = 0
        for name in ("mem_info_vram_used", "mem_info_gtt_used"):
            with contextlib.suppress(OSError, ValueError):
                used += int((card / "device" / name).read_text())
        if used:
            result[f"amdgpu:{card.name}"] = used
    return result


def build_row(
    *,
    frontend: str,
    model: str,
    plan: Any,
    timings: Any,
    prompt_tokens: int,
    generated_tokens: int,
    clock: TokenClock | None = None,
    energy: Energy | None = None,
    memory: Mapping[str, int] | None = None,
    model_path: str | Path = "",
    spec_mode: str = "off",
    label: str = "",
    depth: int | None = None,
) -> Row:
    """A ledger row from what a front end has at the end of a reply: the engine's `Timings`
    (or the first piece's for a continued reply), the plan (`Plan` or `EngineSettings`), the
    token clock it ticked, and the energy measurement that wrapped the reply."""
    size = None
    if model_path:
        with contextlib.suppress(OSError):
            size = Path(model_path).stat().st_size
    figures = timing_fields(clock, timings)
    energy = energy or Energy(None, "", "not measured")
    return Row(
        frontend=frontend,
        model=model,
        plan=PlanInfo.of(plan, spec_mode=spec_mode),
        prompt_tokens=prompt_tokens,
        cached_tokens=int(getattr(timings, "cache_n", 0) or 0),
        generated_tokens=generated_tokens,
        peak_memory=dict(memory if memory is not None else peak_memory()),
        energy_j=energy.joules,
        tokens_per_j=energy.tokens_per_joule(generated_tokens),
        energy_source=energy.source,
        energy_note=energy.note,
        model_path=str(model_path),
        model_size=size,
        label=label,
        depth=depth,
        ttft_ms=figures["ttft_ms"],
        itl_p50_ms=figures["itl_p50_ms"],
        itl_p99_ms=figures["itl_p99_ms"],
        decode_tok_s=figures["decode_tok_s"],
    )
