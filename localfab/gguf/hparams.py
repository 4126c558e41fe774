"""The hyperparameters of a GGUF model, typed and range-checked (part of `localfab.gguf.facts`).

Every count the planner divides by or loops over (layers, heads, head sizes, experts, the
sliding-window layout, the vocabulary) must be an integer in a range llama.cpp itself would
accept; anything else is a corrupt file, said in one line that names the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gguf.constants import GGUFValueType

from localfab.errors import ModelCorrupt, ModelError
from localfab.gguf.header import BigArray, TensorInfo

# llama.cpp keeps hyperparameters in uint32 fields and per-layer ones in arrays of
# LLAMA_MAX_LAYERS (src/llama-hparams.h); it refuses a model with more layers or experts.
MAX_LAYERS = 512
MAX_EXPERTS = 1024
U32_MAX = 2**32 - 1

# Architectures without attention (pure state-space models): their headers say 0 heads.
ATTENTION_FREE = frozenset({"mamba", "mamba2"})

# Default sliding-window layer patterns llama.cpp applies when a GGUF has
# `{arch}.attention.sliding_window` but no `{arch}.attention.sliding_window_pattern`, read from
# llama.cpp src/models/<arch>.cpp (`load_swa_pattern(ml, N)` / `hparams.set_swa_pattern(N)`):
# with period N, layer il uses the window iff il % N < N - 1 (every Nth layer is global).
# Architectures not listed are treated as having no SWA layers, as llama.cpp does for e.g. `llama`
# files that carry Mistral's sliding_window: that also sizes their KV cache in full, which errs on
# the safe side.
SWA_DEFAULT_PERIOD: Mapping[str, int] = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma-embedding": 6,
    "gemma3n": 5,
    "cohere2": 4,
    "exaone4": 4,
}

BLOCK_RE = re.compile(r"^blk\.(\d+)\.")


def describe(value: Any) -> str:
    """A wrongly typed metadata value, in words."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, float):
        return f"a float ({value})"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({text!r})"
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, BigArray):
        return f"an array of {value.count} items"
    return f"{value!r}"


class Checker:
    """Typed, range-checked reads of the hyperparameters the planner computes with.

    Every count the planner divides by or loops over must be an integer in a range llama.cpp
    itself would accept; anything else (a string, a NaN, -5, 0 heads) is a corrupt file, said
    in one line that names the key.
    """

    def __init__(self, meta: Mapping[str, Any], label: str, arch: str) -> None:
        self.meta = meta
        self.label = label
        self.arch = arch

    def bad(self, name: str, problem: str) -> ModelCorrupt:
        return ModelCorrupt(
            f"model file {self.label} is corrupt: {self.arch}.{name} {problem}; "
            f"download it again or get it from its source"
        )

    def get(self, name: str, default: Any = None) -> Any:
        return self.meta.get(f"{self.arch}.{name}", default)

    def need(self, name: str) -> Any:
        value = self.get(name)
        if value is None:
            raise ModelError(
                f"{self.label}: the GGUF header lacks {self.arch}.{name}: the file is not a "
                f"complete {self.arch} model (or the architecture is not supported)"
            )
        return value

    def int_value(self, name: str, value: Any, low: int, high: int, what: str = "") -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(name, f"{what}is {describe(value)}, not an integer")
        if not low <= value <= high:
            raise self.bad(name, f"{what}is {value}, outside {low}..{high}")
        return value

    def count(self, name: str, *, low: int = 1, high: int = U32_MAX, default: Any = None) -> Any:
        """An integer key in [low, high]; `default` (unchecked) when the key is absent."""
        value = self.get(name)
        if value is None:
            return default
        return self.int_value(name, value, low, high)

    def per_layer(
        self, name: str, value: Any, n_layer: int, *, low: int, high: int = U32_MAX
    ) -> int | tuple[int, ...]:
        """One number, or one per layer (collapsed when all are equal)."""
        if isinstance(value, BigArray):  # longer than MAX_KEPT_ARRAY, so than MAX_LAYERS
            raise self.bad(name, f"has {value.count} per-layer entries for {n_layer} layers")
        if isinstance(value, list):
            if len(value) != n_layer:
                raise self.bad(name, f"has {len(value)} per-layer entries for {n_layer} layers")
            values = tuple(
                self.int_value(name, v, low, high, what=f"entry {i} ") for i, v in enumerate(value)
            )
            return values[0] if len(set(values)) == 1 else values
        return self.int_value(name, value, low, high)


def layer_count(c: Checker, infos: list[TensorInfo]) -> int:
    """`block_count`, bounded by llama.cpp's MAX_LAYERS and by the blk.N tensors present.

    Everything per layer is sized by this number, so it is bounded before anything is
    allocated from it.
    """
    c.need("block_count")
    n_layer: int = c.count("block_count", high=MAX_LAYERS)
    blocks = [int(m.group(1)) for t in infos if (m := BLOCK_RE.match(t.name))]
    if blocks and n_layer > max(blocks) + 1:
        raise c.bad(
            "block_count",
            f"says {n_layer} layers but the file holds tensors for {max(blocks) + 1} "
            f"(blk.0 to blk.{max(blocks)})",
        )
    return n_layer


def largest(value: int | tuple[int, ...]) -> int:
    return value if isinstance(value, int) else max(value)


def heads_of(c: Checker, n_layer: int) -> tuple[int | tuple[int, ...], int | tuple[int, ...], int]:
    """(n_head, n_head_kv, the largest n_head).

    A per-layer array may hold 0 for layers without attention (hybrid models), but some layer
    must have heads, unless the architecture has no attention at all.
    """
    n_head = c.per_layer("attention.head_count", c.need("attention.head_count"), n_layer, low=0)
    n_head_max = largest(n_head)
    if n_head_max == 0 and c.arch not in ATTENTION_FREE:
        raise c.bad("attention.head_count", "is 0: a model with attention needs heads")
    kv_raw = c.get("attention.head_count_kv")
    n_head_kv = (
        n_head if kv_raw is None else c.per_layer("attention.head_count_kv", kv_raw, n_layer, low=0)
    )
    if largest(n_head_kv) == 0 and n_head_max > 0:
        raise c.bad("attention.head_count_kv", "is 0: a model with attention needs KV heads")
    return n_head, n_head_kv, n_head_max


def head_lengths(c: Checker, n_embd: int, n_head_max: int) -> tuple[int, int]:
    """(key_length, value_length).

    They multiply every KV-cache estimate; 0 would make the cache free. Without the keys they
    default to n_embd / n_head, as in llama.cpp.
    """
    head_low = 0 if n_head_max == 0 else 1
    default_head_dim = n_embd // n_head_max if n_head_max else 0
    key_length: int = c.count("attention.key_length", low=head_low, default=default_head_dim)
    value_length: int = c.count("attention.value_length", low=head_low, default=default_head_dim)
    if n_head_max and not (key_length and value_length):
        raise c.bad(
            "embedding_length", f"is {n_embd}, smaller than the {n_head_max} attention heads"
        )
    return key_length, value_length


def check_experts(c: Checker, n_layer: int) -> None:
    """Mixture of experts: not planned with yet, but a file whose counts llama.cpp refuses
    (more experts than it supports, more used per token than there are) is not a model."""
    n_expert = c.count("expert_count", low=0, high=MAX_EXPERTS, default=0)
    used = c.get("expert_used_count")
    if used is None:
        return
    n_used_max = largest(c.per_layer("expert_used_count", used, n_layer, low=0))
    if n_used_max > n_expert:
        raise c.bad("expert_used_count", f"is {n_used_max}, more than the {n_expert} experts")
    if n_expert and not n_used_max:
        raise c.bad("expert_used_count", f"is 0 with {n_expert} experts")


def sliding_window_of(c: Checker, n_layer: int) -> tuple[int | None, tuple[bool, ...]]:
    """(sliding window size or None, which layers use it)."""
    window = c.count("attention.sliding_window", low=0)
    sliding_window = window or None
    pattern = c.get("attention.sliding_window_pattern")
    if isinstance(pattern, list | BigArray):
        n = len(pattern) if isinstance(pattern, list) else pattern.count
        if isinstance(pattern, BigArray) or n != n_layer:
            raise c.bad("attention.sliding_window_pattern", f"has {n} entries for {n_layer} layers")
        if not all(isinstance(p, bool | int) for p in pattern):
            raise c.bad("attention.sliding_window_pattern", "holds values that are not flags")
    elif pattern is not None:
        c.int_value("attention.sliding_window_pattern", pattern, 0, U32_MAX)
    return sliding_window, swa_layers_of(c.arch, pattern, sliding_window, n_layer)


def corrupt(label: str, problem: str) -> ModelCorrupt:
    return ModelCorrupt(
        f"model file {label} is corrupt: {problem}; download it again or get it from its source"
    )


def token_list_size(tokens: Any, label: str) -> int:
    """The length of `tokenizer.ggml.tokens`, which must be a non-empty array of strings."""
    if isinstance(tokens, BigArray):
        n_vocab, is_strings = tokens.count, tokens.item_type == GGUFValueType.STRING
    elif isinstance(tokens, list):
        n_vocab, is_strings = len(tokens), all(isinstance(t, str) for t in tokens)
    else:
        n_vocab, is_strings = 0, False
    if not is_strings:
        raise corrupt(
            label, f"tokenizer.ggml.tokens is {describe(tokens)}, not an array of strings"
        )
    if n_vocab < 1:
        raise corrupt(label, "tokenizer.ggml.tokens is empty")
    return n_vocab


def vocab_size(
    meta: Mapping[str, Any], c: Checker, by_name: Mapping[str, TensorInfo], label: str
) -> int:
    """The token list's length, else vocab_size, else the embedding's width; 0 if none."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None:
        return token_list_size(tokens, label)
    if c.get("vocab_size") is not None:
        return int(c.count("vocab_size"))
    if "token_embd.weight" in by_name:
        n_vocab = by_name["token_embd.weight"].shape[-1]
        if n_vocab < 1:
            raise corrupt(label, "token_embd.weight has an empty vocabulary dimension")
        return n_vocab
    return 0


def swa_layers_of(
    arch: str, pattern: Any, sliding_window: int | None, n_layer: int
) -> tuple[bool, ...]:
    """Which layers use the sliding window, following llama.cpp's `load_swa_pattern`.

    The pattern key may be a bool array (one per layer) or a period N (every Nth layer global);
    without it, the architecture's built-in period applies (`SWA_DEFAULT_PERIOD`).
    """
    if not sliding_window:
        return (False,) * n_layer
    if isinstance(pattern, list) and len(pattern) == n_layer:
        return tuple(bool(p) for p in pattern)
    period = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) else None
    if period is None:
        period = SWA_DEFAULT_PERIOD.get(arch)
    if period is None:
        return (False,) * n_layer
    if period == 0:
        return (True,) * n_layer
    return tuple(il % period < period - 1 for il in range(n_layer))
