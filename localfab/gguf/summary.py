"""A model's header facts in a few kilobytes of JSON, and `ModelFacts` again from them.

The planner needs a GGUF header's hyperparameters and its tensor table (names, types, shapes),
not its tokenizer or chat template (most of a header's megabytes). A summary keeps exactly what
`facts_from_parts` reads: the scalar and short-array metadata of the architecture, the file type,
the special tokens, the vocabulary's size, and the tensor table, whose layers are stored once per
distinct layout (a Q4_K_M file has two or three). `facts_from_summary(summarize(f))` plans as `f`
does: the same parser builds both. The catalog ships one per model (`models/catalog_facts.json`,
written by `scripts/catalog_facts.py`), so a fit is known before download even offline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from localfab.errors import ModelError
from localfab.gguf.facts import ModelFacts, facts_from_parts
from localfab.gguf.header import TensorInfo
from localfab.gguf.hparams import BLOCK_RE

SUMMARY_VERSION = 1
_KEPT_KEYS = (
    "general.architecture",
    "general.name",
    "general.file_type",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
)
_MAX_ARRAY = 1024  # per-layer arrays (heads, sliding-window pattern) are kept; nothing longer
_ALIGN = 32


def summarize(facts: ModelFacts, *, source: str = "header") -> dict[str, Any]:
    """The summary of `facts` (read from a header); `source` says where the facts came from."""
    arch = facts.arch
    meta: dict[str, Any] = {}
    for key, value in facts.metadata.items():
        if key in _KEPT_KEYS or (key.startswith(f"{arch}.") and _small(value)):
            meta[key] = list(value) if isinstance(value, tuple) else value
    meta[f"{arch}.vocab_size"] = facts.n_vocab  # the token list itself is not kept
    layouts: list[list[list[Any]]] = []
    layers: list[int] = []
    others: list[list[Any]] = []
    per_layer: dict[int, list[list[Any]]] = {}
    for t in facts.tensors:
        m = BLOCK_RE.match(t.name)
        row = [t.ggml_type, list(t.shape)]
        if m and int(m.group(1)) < facts.n_layer:
            suffix = t.name[len(f"blk.{m.group(1)}.") :]
            per_layer.setdefault(int(m.group(1)), []).append([suffix, *row])
        else:
            others.append([t.name, *row])
    for il in range(facts.n_layer):
        layout = per_layer.get(il, [])
        if layout not in layouts:
            layouts.append(layout)
        layers.append(layouts.index(layout))
    return {
        "summary_version": SUMMARY_VERSION,
        "source": source,
        "gguf_version": facts.gguf_version,
        "file_size": facts.file_size,
        "tensor_data_offset": facts.tensor_data_offset,
        "metadata": meta,
        "layouts": layouts,
        "layers": layers,
        "tensors": others,
    }


def facts_from_summary(summary: Mapping[str, Any], *, label: str = "summary") -> ModelFacts:
    """`ModelFacts` from a summary (raises `ModelError` if it is not one this version reads)."""
    if summary.get("summary_version") != SUMMARY_VERSION:
        raise ModelError(f"{label}: not a model summary of version {SUMMARY_VERSION}")
    try:
        layouts = summary["layouts"]
        rows: list[tuple[str, int, list[int]]] = []
        for il, layout in enumerate(summary["layers"]):
            rows += [(f"blk.{il}.{suffix}", t, shape) for suffix, t, shape in layouts[layout]]
        rows += [(name, t, shape) for name, t, shape in summary["tensors"]]
        infos = []
        offset = 0
        for name, ggml_type, shape in rows:
            nbytes = _nbytes(int(ggml_type), tuple(int(d) for d in shape))
            infos.append(TensorInfo(str(name), int(ggml_type), tuple(shape), offset, nbytes))
            offset += -(-nbytes // _ALIGN) * _ALIGN
        return facts_from_parts(
            dict(summary["metadata"]),
            infos,
            label=label,
            file_size=summary.get("file_size"),
            version=int(summary["gguf_version"]),
            data_offset=int(summary["tensor_data_offset"]),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ModelError(f"{label}: a damaged model summary ({type(exc).__name__}: {exc})") from exc


@lru_cache(maxsize=1)
def _catalog_summaries() -> dict[str, Any]:
    from localfab.resources import catalog_facts_text

    text = catalog_facts_text()
    if text is None:
        return {}
    try:
        models = json.loads(text).get("models", {})
    except (ValueError, AttributeError):
        return {}  # a damaged file: fits need the network, as without one
    return models if isinstance(models, dict) else {}


def catalog_facts(name: str) -> tuple[ModelFacts, str] | None:
    """The shipped facts of catalog model `name` and where they came from ("header": its file's
    header; "config": its published architecture), or None when the catalog has none."""
    summary = _catalog_summaries().get(name)
    if not isinstance(summary, dict):
        return None
    try:
        facts = facts_from_summary(summary, label=f"the catalog's facts of {name}")
    except ModelError:
        return None
    return facts, str(summary.get("source", "header"))


def _small(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return len(value) <= _MAX_ARRAY and all(_small(v) for v in value)
    return isinstance(value, int | float | str | bool)


def _nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return type_size if not shape else math.prod(shape) // block_size * type_size
