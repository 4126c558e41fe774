"""What `localfab serve` was asked for, in one frozen object (no web framework imported)."""

from __future__ import annotations

from dataclasses import dataclass

from localfab import __version__

MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Server options; names follow llama-server's flags where one exists."""

    model_name: str = ""  # what /v1/models and responses call the model (default: the -m path)
    alias: str | None = None  # --alias: overrides model_name
    api_keys: tuple[str, ...] = ()  # --api-key (repeatable); empty: no authentication
    metrics: bool = False  # --metrics: enable /metrics
    slots: bool = True  # --no-slots turns /slots off
    n_parallel: int = 1  # -np: accepted; requests are decoded one at a time, the rest queue
    n_predict: int = -1  # -n: default and upper bound of tokens per request (-1: none)
    temperature: float = 0.8  # --temp: default sampling temperature
    seed: int = -1  # --seed: default sampling seed (-1: random)
    context_shift: bool = False  # --context-shift: drop old tokens instead of stopping when full
    max_body_bytes: int = 8 * MiB  # larger request bodies get 413 without being read
    read_timeout: float = 600.0  # -to: seconds to receive a request body before 408
    build_info: str = f"localfab-{__version__}"

    @property
    def public_model_name(self) -> str:
        return self.alias or self.model_name
