"""Short summaries of a plan, for lists and tables."""

from __future__ import annotations

from typing import Any

from localfab.units import format_context


def summarise_plan(result: Any) -> str:
    """One short cell for a `Plan`: where the layers go and the context it leaves room for."""
    ctx = format_context(result.n_ctx)
    if not result.fits:
        return "too big"
    if result.gpu is None or result.n_gpu_layers == 0:
        return f"CPU {ctx}"
    if result.all_on_gpu:
        return f"GPU {ctx}"
    return f"{result.n_gpu_layers}/{result.n_layer + 1} GPU {ctx}"
