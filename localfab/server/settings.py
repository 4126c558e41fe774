"""What `localfab serve` was asked for, in one frozen object (no web framework imported)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localfab import __version__
from localfab.engine.types import SamplingParams
from localfab.units import MiB

# The engine's sampling defaults (llama-server's): one definition, not a copy per layer.
_SAMPLING = SamplingParams()


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Server options; names follow llama-server's flags where one exists."""

    model_name: str = ""  # what /v1/models and responses call the model (default: the -m path)
    alias: str | None = None  # --alias: overrides model_name
    tags: tuple[str, ...] = ()  # --tags: informational, listed in /v1/models
    sleep_idle_seconds: float = -1  # --sleep-idle-seconds: free the model when idle (-1: never)
    spm_infill: bool = False  # --spm-infill: /infill puts the suffix before the prefix
    api_keys: tuple[str, ...] = ()  # --api-key (repeatable); empty: no authentication
    metrics: bool = False  # --metrics: enable /metrics
    slots: bool = True  # --no-slots turns /slots off
    n_parallel: int = 1  # -np: slots; also the most results (`n`) one request may ask for
    n_predict: int = -1  # -n: tokens per request that sets none (-1: no limit), as llama-server
    # Default sampling for requests that do not set it: --temp etc., else config.toml/LOCALFAB_*.
    temperature: float = _SAMPLING.temperature  # --temp
    top_k: int = _SAMPLING.top_k  # --top-k: 0 disables
    top_p: float = _SAMPLING.top_p  # --top-p: 1.0 disables
    min_p: float = _SAMPLING.min_p  # --min-p: 0.0 disables
    repeat_penalty: float = _SAMPLING.repeat_penalty  # --repeat-penalty: 1.0 disables
    seed: int = -1  # --seed: default sampling seed (-1: random)
    context_shift: bool = False  # --context-shift: drop old tokens instead of stopping when full
    # --cache-ram: bytes for idle prompts' KV states (None: no limit, 0: off)
    cache_ram: int | None = 0
    # --cache-idle-slots (llama-server's default): when a job starts, idle slots' prompts go to
    # the prompt cache, and with a unified KV pool leave it, so the running ones have the room.
    cache_idle_slots: bool = True
    # --cache-disk: the prompt cache's disk tier (folder, bytes); None: RAM only.
    cache_disk: tuple[Path, int] | None = None
    # Thinking models: --reasoning-format (none, deepseek, deepseek-legacy, auto: where the
    # reasoning goes), -rea/--reasoning (on, off, auto: the template's enable_thinking) and
    # --chat-template-kwargs (the template's own variables, as JSON).
    reasoning_format: str = "auto"
    reasoning: str = "auto"
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()
    # --jinja / --no-jinja: requests may carry tools (rendered by the chat template, the
    # reply's calls parsed); llama-server's default is on.
    jinja: bool = True
    # --tool-call-lenient: a reply that is only a bare JSON call of an offered tool (no markers,
    # or in a ```json block, maybe left unclosed), as small models write them, comes back as
    # tool_calls; llama-server leaves such a reply as content, and so does the default.
    tool_call_lenient: bool = False
    # --reasoning-budget (tokens of thought before the block is closed; -1: no limit),
    # --reasoning-budget-message (written before the closing tag then), --reasoning-effort
    # (the template's reasoning_effort variable; "default": the template's own).
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""
    reasoning_effort: str = "default"
    # --reasoning-preserve / --no-reasoning-preserve: the template's preserve_reasoning (keep
    # earlier turns' reasoning in the prompt, where the template can); None: its default.
    reasoning_preserve: bool | None = None
    media_path: Path | None = None  # --media-path: where file:// image URLs are read
    slot_save_path: Path | None = None  # --slot-save-path: where /slots/{id}?action=save writes
    max_body_bytes: int = 8 * MiB  # larger request bodies get 413 without being read
    read_timeout: float = 600.0  # -to: seconds to receive a request body before 408
    header_timeout: float = 10.0  # --header-timeout: seconds to receive a request head
    max_connections: int = 256  # --max-connections: open at most; idle ones make room
    check_host: bool = True  # a loopback bind answers only loopback Host names
    allowed_origins: tuple[str, ...] = ()  # --allowed-origins: besides loopback ones; "*": any
    verbose: bool = False  # --verbose: answers carry llama-server's `__verbose` field
    # LLAMA_SERVER_SLOTS_DEBUG (as llama-server): /slots also shows each slot's prompt and
    # generated text, which other clients may otherwise not read.
    slots_debug: bool = field(
        default_factory=lambda: os.environ.get("LLAMA_SERVER_SLOTS_DEBUG", "0") not in ("", "0")
    )
    build_info: str = f"localfab-{__version__}"

    def template_variables(self, asked: Any = None) -> dict[str, Any]:
        """The chat template's variables for a request: --chat-template-kwargs, then
        --reasoning-effort and --reasoning on/off as enable_thinking, then the request's own
        `chat_template_kwargs`."""
        out = dict(self.chat_template_kwargs)
        if self.reasoning_effort != "default":
            out["reasoning_effort"] = self.reasoning_effort
        if self.reasoning_preserve is not None:
            out["preserve_reasoning"] = self.reasoning_preserve
        if self.reasoning != "auto":
            out["enable_thinking"] = self.reasoning == "on"
        if asked is not None:
            out.update(asked)
        return out

    @property
    def aliases(self) -> tuple[str, ...]:
        """--alias a,b,c: the names clients may use, in llama-server's (sorted) order."""
        return tuple(sorted({a.strip() for a in (self.alias or "").split(",") if a.strip()}))

    @property
    def public_model_name(self) -> str:
        """The model's id: the first alias, as llama-server names it, else the model's name."""
        return self.aliases[0] if self.aliases else self.model_name
