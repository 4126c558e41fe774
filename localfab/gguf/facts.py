"""Model facts read from a GGUF header, without loading a single tensor.

The planner needs to know, before a model is loaded (or even downloaded), how big every layer is,
how the attention is shaped (heads, KV heads, head sizes, which layers use a sliding window) and
how big the vocabulary is. All of that is in the GGUF header: the metadata key/value pairs and the
tensor infos (name, shape, ggml type, offset). This module parses exactly that part of the file.

It is a small parser of its own rather than `gguf.GGUFReader`, because that reader memory-maps the
whole file and so cannot work on a file that is still on a server. Here every read goes through a
`RangeSource` (`read(offset, size)` and `size()`), in buffered chunks that grow as the header turns
out to be long, so a remote header costs a handful of ranged requests; fixed-size arrays (token
scores, token types) are skipped without being fetched. The `gguf` package supplies the constants:
value types, ggml quantisation block sizes, file type names.

GGUF layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic "GGUF", version
(u32), tensor count (u64), metadata count (u64), the metadata pairs (key string, value type u32,
value), the tensor infos (name, n_dims u32, dims u64 each, ggml type u32, offset u64), then
padding to `general.alignment` (default 32) and the tensor data.

The byte-level reading is in `facts_header`, the typed and range-checked hyperparameters in
`facts_hparams`; this module puts them together into `ModelFacts`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf.constants import LlamaFileType

from localfab.errors import ModelCorrupt, ModelError
from localfab.gguf.header import (
    MAX_KEPT_ARRAY,
    BigArray,
    Cursor,
    FileSource,
    RangeSource,
    TensorInfo,
    read_header,
)
from localfab.gguf.hparams import (
    BLOCK_RE,
    MAX_EXPERTS,
    MAX_LAYERS,
    SWA_DEFAULT_PERIOD,
    U32_MAX,
    Checker,
    check_experts,
    head_lengths,
    heads_of,
    layer_count,
    sliding_window_of,
    vocab_size,
)
from localfab.gguf.modelfile import check_model_file

__all__ = [
    "MAX_EXPERTS",
    "MAX_KEPT_ARRAY",
    "MAX_LAYERS",
    "SWA_DEFAULT_PERIOD",
    "FileSource",
    "ModelFacts",
    "RangeSource",
    "TensorInfo",
    "read_facts",
]


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs to know about a GGUF model, all from its header.

    Byte counts are exact (ggml block sizes × shapes). `layer_bytes[i]` is every tensor named
    `blk.i.*`; `token_embd_bytes` stays on the CPU in llama.cpp; `output_bytes` is the separate
    output (LM head) tensor, 0 when the model ties it to the token embedding (`output_tied`).
    """

    arch: str
    name: str | None
    n_layer: int
    n_embd: int
    n_head: int | tuple[int, ...]
    n_head_kv: int | tuple[int, ...]
    key_length: int
    value_length: int
    n_ff: int | tuple[int, ...] | None
    sliding_window: int | None
    swa_layers: tuple[bool, ...]
    n_ctx_train: int
    n_vocab: int
    file_type: int | None
    chat_template: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    layer_bytes: tuple[int, ...]
    token_embd_bytes: int
    output_bytes: int
    output_tied: bool
    output_norm_bytes: int
    other_bytes: int
    total_tensor_bytes: int
    tensor_data_offset: int
    file_size: int | None
    gguf_version: int
    tensors: tuple[TensorInfo, ...] = field(repr=False, compare=False)
    metadata: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def file_type_name(self) -> str | None:
        """`MOSTLY_Q4_K_M` and the like, from `general.file_type`."""
        if self.file_type is None:
            return None
        try:
            return LlamaFileType(self.file_type).name
        except ValueError:
            return f"file_type {self.file_type}"

    def head_kv(self, il: int) -> int:
        """KV heads of layer `il` (some models vary them per layer)."""
        return self.n_head_kv if isinstance(self.n_head_kv, int) else self.n_head_kv[il]

    def heads(self, il: int) -> int:
        """Query heads of layer `il`."""
        return self.n_head if isinstance(self.n_head, int) else self.n_head[il]

    def is_swa(self, il: int) -> bool:
        """Whether layer `il` attends through the sliding window."""
        return self.swa_layers[il]

    @property
    def n_swa_layers(self) -> int:
        return sum(self.swa_layers)

    @property
    def n_params_bytes_repeating(self) -> int:
        """Bytes of the repeating layers only (what `n_gpu_layers` moves)."""
        return sum(self.layer_bytes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (no tensor list, no large metadata)."""
        return {
            "arch": self.arch,
            "name": self.name,
            "n_layer": self.n_layer,
            "n_embd": self.n_embd,
            "n_head": _jsonable(self.n_head),
            "n_head_kv": _jsonable(self.n_head_kv),
            "key_length": self.key_length,
            "value_length": self.value_length,
            "n_ff": _jsonable(self.n_ff),
            "sliding_window": self.sliding_window,
            "swa_layers": [i for i, s in enumerate(self.swa_layers) if s],
            "n_ctx_train": self.n_ctx_train,
            "n_vocab": self.n_vocab,
            "file_type": self.file_type_name,
            "has_chat_template": self.chat_template is not None,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "layer_bytes": list(self.layer_bytes),
            "token_embd_bytes": self.token_embd_bytes,
            "output_bytes": self.output_bytes,
            "output_tied": self.output_tied,
            "total_tensor_bytes": self.total_tensor_bytes,
            "tensor_data_offset": self.tensor_data_offset,
            "file_size": self.file_size,
        }


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _source_and_label(
    path_or_source: str | os.PathLike[str] | RangeSource,
) -> tuple[RangeSource, str]:
    if isinstance(path_or_source, str | os.PathLike):
        path = Path(path_or_source)
        check_model_file(path)
        return FileSource(path), str(path)
    if isinstance(path_or_source, RangeSource):
        return path_or_source, getattr(path_or_source, "label", None) or repr(path_or_source)
    raise TypeError(f"read_facts needs a path or a RangeSource, not {type(path_or_source)!r}")


def read_facts(path_or_source: str | os.PathLike[str] | RangeSource) -> ModelFacts:
    """Parse the GGUF header of a local file or of any `RangeSource` into `ModelFacts`.

    Raises `ModelError` when the file is missing, is not GGUF, or its header is truncated or
    corrupt; the message names the byte offset and what to do.
    """
    source, label = _source_and_label(path_or_source)
    cur = Cursor(source, label)
    header = read_header(cur, label)
    try:
        return facts_from_parts(
            header.meta,
            header.infos,
            label=label,
            file_size=cur.total,
            version=header.version,
            data_offset=header.data_offset,
        )
    except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
        # The checks in facts_from_parts name the key at fault; this is the net under them.
        raise ModelCorrupt(
            f"model file {label} is corrupt: {exc}; download it again or get it from its source"
        ) from exc


@dataclass(frozen=True)
class _TensorBytes:
    layers: tuple[int, ...]
    token_embd: int
    output: int
    output_norm: int
    other: int


def _tensor_bytes(infos: list[TensorInfo], n_layer: int) -> _TensorBytes:
    """Tensor bytes by where llama.cpp puts them: per layer, embedding, output, the rest."""
    layer_bytes = [0] * n_layer
    token_embd = output = output_norm = other = 0
    for t in infos:
        m = BLOCK_RE.match(t.name)
        if m and int(m.group(1)) < n_layer:
            layer_bytes[int(m.group(1))] += t.nbytes
        elif t.name == "token_embd.weight":
            token_embd = t.nbytes
        elif t.name.startswith("output."):
            output += t.nbytes
        elif t.name.startswith("output_norm."):
            output_norm += t.nbytes
        else:
            other += t.nbytes
    return _TensorBytes(tuple(layer_bytes), token_embd, output, output_norm, other)


def facts_from_parts(
    meta: dict[str, Any],
    infos: list[TensorInfo],
    *,
    label: str,
    file_size: int | None,
    version: int,
    data_offset: int,
) -> ModelFacts:
    """`ModelFacts` from a header's metadata and tensor infos (read, or kept in a summary)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{label}: the GGUF header has no general.architecture: not a model file")
    c = Checker(meta, label, arch)
    by_name = {t.name: t for t in infos}
    n_layer = layer_count(c, infos)
    n_embd = c.int_value("embedding_length", c.need("embedding_length"), 1, U32_MAX)
    n_head, n_head_kv, n_head_max = heads_of(c, n_layer)
    key_length, value_length = head_lengths(c, n_embd, n_head_max)
    n_ff_raw = c.get("feed_forward_length")
    n_ff = (
        None if n_ff_raw is None else c.per_layer("feed_forward_length", n_ff_raw, n_layer, low=0)
    )
    check_experts(c, n_layer)
    sliding_window, swa_layers = sliding_window_of(c, n_layer)
    n_ctx_train = c.count("context_length", default=0)
    n_vocab = vocab_size(meta, c, by_name, label)
    sizes = _tensor_bytes(infos, n_layer)
    return ModelFacts(
        arch=arch,
        name=_str_or_none(meta.get("general.name")),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        key_length=key_length,
        value_length=value_length,
        n_ff=n_ff,
        sliding_window=sliding_window,
        swa_layers=swa_layers,
        n_ctx_train=n_ctx_train,
        n_vocab=int(n_vocab),
        file_type=_int_or_none(meta.get("general.file_type")),
        chat_template=_str_or_none(meta.get("tokenizer.chat_template")),
        bos_token_id=_int_or_none(meta.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_int_or_none(meta.get("tokenizer.ggml.eos_token_id")),
        layer_bytes=sizes.layers,
        token_embd_bytes=sizes.token_embd,
        output_bytes=sizes.output,
        output_tied="output.weight" not in by_name,
        output_norm_bytes=sizes.output_norm,
        other_bytes=sizes.other,
        total_tensor_bytes=sum(t.nbytes for t in infos),
        tensor_data_offset=data_offset,
        file_size=file_size,
        gguf_version=version,
        tensors=tuple(infos),
        metadata={k: v for k, v in meta.items() if not isinstance(v, BigArray)},
    )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
