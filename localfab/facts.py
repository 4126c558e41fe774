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
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
    LlamaFileType,
)

from localfab.errors import ModelError

__all__ = [
    "FileSource",
    "ModelFacts",
    "RangeSource",
    "TensorInfo",
    "read_facts",
]

# Arrays longer than this are not kept in `ModelFacts.metadata` (only their length is): the
# vocabulary, merges and scores of a 262k-token model would otherwise be megabytes of Python
# objects that nothing in the planner reads. Per-layer arrays (head counts, SWA pattern) are short.
MAX_KEPT_ARRAY = 4096

# Sanity bounds that tell a corrupt header from a real one. Real headers have a few hundred keys
# and at most tens of thousands of tensors (MoE models); a string longer than 64 MiB in a header
# (chat templates are tens of KiB) means the length field is garbage.
_MAX_KV = 1 << 20
_MAX_TENSORS = 1 << 22
_MAX_STRING = 64 << 20
_MAX_DIMS = 4  # GGML_MAX_DIMS

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

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")

_SCALAR_FORMATS: Mapping[int, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


@runtime_checkable
class RangeSource(Protocol):
    """Anything that can hand out byte ranges of a file: a local file, an HTTP ranged reader."""

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes from `offset`; fewer only at the end of the file."""
        ...

    def size(self) -> int | None:
        """Total size in bytes, or None if unknown."""
        ...


class FileSource:
    """A `RangeSource` over a local file, opened per read so nothing is left open."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def read(self, offset: int, size: int) -> bytes:
        with self.path.open("rb") as f:
            f.seek(offset)
            return f.read(size)

    def size(self) -> int | None:
        return self.path.stat().st_size

    def __repr__(self) -> str:
        return f"FileSource({str(self.path)!r})"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it; `nbytes` is exact for its ggml type."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type{self.ggml_type}"


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


@dataclass(frozen=True)
class _BigArray:
    """Stand-in for an array too long to keep: its element type and length."""

    item_type: int
    count: int


class _Cursor:
    """Sequential reads over a RangeSource through a growing read-ahead buffer.

    The first fetch is small (a header of a small model fits); each refill doubles the chunk up
    to `max_chunk`, so a 5 MB header of a 262k-vocabulary model costs about six requests.
    """

    def __init__(
        self, source: RangeSource, label: str, *, chunk: int = 256 << 10, max_chunk: int = 8 << 20
    ) -> None:
        self.source = source
        self.label = label
        self.total = source.size()
        self.pos = 0
        self.buf = b""
        self.buf_start = 0
        self.chunk = chunk
        self.max_chunk = max_chunk
        self.what = "the header"

    # errors -------------------------------------------------------------------------------
    def truncated(self, offset: int) -> ModelError:
        size = f" (file is {self.total} bytes)" if self.total is not None else ""
        return ModelError(
            f"{self.label}: GGUF header truncated at byte {offset} while reading {self.what}"
            f"{size}: the file is incomplete; download it again"
        )

    def corrupt(self, offset: int, problem: str) -> ModelError:
        return ModelError(
            f"{self.label}: corrupt GGUF header at byte {offset} ({self.what}): {problem}; "
            f"the file is damaged or not a model; download it again"
        )

    # reading ------------------------------------------------------------------------------
    def _fill(self, need: int) -> None:
        """Make buf cover [pos, pos + need)."""
        want = max(need, self.chunk)
        self.chunk = min(self.chunk * 2, self.max_chunk)
        if self.total is not None:
            if self.pos + need > self.total:
                raise self.truncated(self.total)
            want = min(want, self.total - self.pos)
        try:
            data = self.source.read(self.pos, want)
        except OSError as exc:
            raise ModelError(f"{self.label}: cannot read byte {self.pos}: {exc}") from exc
        if len(data) < need:
            raise self.truncated(self.pos + len(data))
        # keep what is still unread of the old buffer? pos is always at or past it, so no.
        self.buf = data
        self.buf_start = self.pos

    def take(self, n: int) -> bytes | memoryview:
        rel = self.pos - self.buf_start
        if rel < 0 or rel + n > len(self.buf):
            self._fill(n)
            rel = 0
        self.pos += n
        return memoryview(self.buf)[rel : rel + n]

    def skip(self, n: int) -> None:
        """Move past `n` bytes without fetching them (the next read fetches from there)."""
        if self.total is not None and self.pos + n > self.total:
            raise self.truncated(self.total)
        self.pos += n

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.take(size))[0]

    def u32(self) -> int:
        return int(self.unpack("<I"))

    def u64(self) -> int:
        return int(self.unpack("<Q"))

    def string(self) -> str:
        at = self.pos
        n = self.u64()
        if n > _MAX_STRING:
            raise self.corrupt(at, f"string length {n} is impossible")
        raw = bytes(self.take(n))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            # llama.cpp accepts any bytes here; keep going rather than refuse a usable model.
            return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Skip `count` length-prefixed strings; a tight loop since vocabularies hold 262k."""
        unpack_from = struct.unpack_from
        done = 0
        while done < count:
            rel = self.pos - self.buf_start
            buf = self.buf
            end = len(buf)
            if rel < 0 or rel + 8 > end:
                self._fill(8)
                continue
            while done < count and rel + 8 <= end:
                n = unpack_from("<Q", buf, rel)[0]
                if n > _MAX_STRING:
                    raise self.corrupt(self.buf_start + rel, f"string length {n} is impossible")
                rel += 8 + n
                done += 1
            # rel may now point past the buffer: the next fill starts there
            self.pos = self.buf_start + rel
            if self.total is not None and self.pos > self.total:
                raise self.truncated(self.total)


def _value(cur: _Cursor, vtype: int) -> Any:
    fmt = _SCALAR_FORMATS.get(vtype)
    if fmt is not None:
        return cur.unpack("<" + fmt)
    if vtype == GGUFValueType.STRING:
        return cur.string()
    if vtype == GGUFValueType.ARRAY:
        at = cur.pos
        item_type = cur.u32()
        count = cur.u64()
        if item_type == GGUFValueType.ARRAY:
            raise cur.corrupt(at, "nested arrays are not part of GGUF")
        item_fmt = _SCALAR_FORMATS.get(item_type)
        if item_fmt is not None:
            item_size = struct.calcsize(item_fmt)
            if count > MAX_KEPT_ARRAY:
                cur.skip(count * item_size)
                return _BigArray(item_type, count)
            raw = cur.take(count * item_size)
            return list(struct.unpack_from(f"<{count}{item_fmt}", raw))
        if item_type == GGUFValueType.STRING:
            if count > MAX_KEPT_ARRAY:
                cur.skip_strings(count)
                return _BigArray(item_type, count)
            return [cur.string() for _ in range(count)]
        raise cur.corrupt(at, f"unknown array item type {item_type}")
    raise cur.corrupt(cur.pos - 4, f"unknown value type {vtype}")


def _tensor_nbytes(cur: _Cursor, at: int, name: str, ggml_type: int, shape: tuple[int, ...]) -> int:
    try:
        qtype = GGMLQuantizationType(ggml_type)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise cur.corrupt(at, f"tensor {name!r} has unknown ggml type {ggml_type}") from None
    if not shape:
        return type_size
    if shape[0] % block_size:
        raise cur.corrupt(
            at, f"tensor {name!r} row of {shape[0]} is not a multiple of its {block_size}-block"
        )
    n = shape[0] // block_size * type_size
    for d in shape[1:]:
        n *= d
    return n


def _source_and_label(
    path_or_source: str | os.PathLike[str] | RangeSource,
) -> tuple[RangeSource, str]:
    if isinstance(path_or_source, str | os.PathLike):
        path = Path(path_or_source)
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise ModelError(f"{path} {what}: give the path of a .gguf file")
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
    cur = _Cursor(source, label)

    cur.what = "the magic number"
    if cur.total is not None and cur.total < 4:
        raise ModelError(f"{label} is not a GGUF file ({cur.total} bytes long)")
    try:
        magic_raw = bytes(cur.take(4))
    except ModelError:
        raise ModelError(f"{label} is not a GGUF file (too short)") from None
    if struct.unpack("<I", magic_raw)[0] != GGUF_MAGIC:
        raise ModelError(
            f"{label} is not a GGUF file (it starts with {magic_raw!r}, not b'GGUF'): "
            f"localfab runs GGUF models, e.g. a *Q4_K_M.gguf file from Hugging Face"
        )
    cur.what = "the version"
    version = cur.u32()
    if version & 0xFFFF == 0 and version != 0:
        raise ModelError(f"{label} is a big-endian GGUF file: use the little-endian build")
    if version not in (2, 3):
        raise cur.corrupt(4, f"GGUF version {version} is not supported (2 and 3 are)")
    cur.what = "the tensor and key counts"
    n_tensors = cur.u64()
    n_kv = cur.u64()
    if n_tensors > _MAX_TENSORS:
        raise cur.corrupt(8, f"tensor count {n_tensors} is impossible")
    if n_kv > _MAX_KV:
        raise cur.corrupt(16, f"metadata count {n_kv} is impossible")

    meta: dict[str, Any] = {}
    for i in range(n_kv):
        cur.what = f"metadata entry {i} of {n_kv}"
        key = cur.string()
        cur.what = f"metadata value {key!r}"
        at = cur.pos
        vtype = cur.u32()
        if key in meta:
            raise cur.corrupt(at, f"metadata key {key!r} appears twice")
        meta[key] = _value(cur, vtype)

    tensors: list[tuple[str, int, tuple[int, ...], int, int]] = []
    for i in range(n_tensors):
        cur.what = f"tensor info {i} of {n_tensors}"
        at = cur.pos
        name = cur.string()
        n_dims = cur.u32()
        if not 0 < n_dims <= _MAX_DIMS:
            raise cur.corrupt(at, f"tensor {name!r} has {n_dims} dimensions")
        shape = tuple(cur.u64() for _ in range(n_dims))
        ggml_type = cur.u32()
        offset = cur.u64()
        tensors.append((name, ggml_type, shape, offset, at))

    alignment = meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.corrupt(0, f"general.alignment {alignment!r} is not a power of two")
    data_offset = -(-cur.pos // alignment) * alignment

    cur.what = "the tensor infos"
    infos: list[TensorInfo] = []
    for name, ggml_type, shape, offset, at in tensors:
        nbytes = _tensor_nbytes(cur, at, name, ggml_type, shape)
        if offset % alignment:
            raise cur.corrupt(at, f"tensor {name!r} offset {offset} is not {alignment}-aligned")
        if cur.total is not None and data_offset + offset + nbytes > cur.total:
            raise ModelError(
                f"{label}: tensor {name!r} ends at byte {data_offset + offset + nbytes} but the "
                f"file is {cur.total} bytes: the file is truncated; download it again"
            )
        infos.append(TensorInfo(name, ggml_type, shape, offset, nbytes))

    return _facts(meta, infos, label=label, cur=cur, version=version, data_offset=data_offset)


def _facts(
    meta: dict[str, Any],
    infos: list[TensorInfo],
    *,
    label: str,
    cur: _Cursor,
    version: int,
    data_offset: int,
) -> ModelFacts:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{label}: the GGUF header has no general.architecture: not a model file")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    def need(name: str) -> Any:
        value = key(name)
        if value is None:
            raise ModelError(
                f"{label}: the GGUF header lacks {arch}.{name}: the file is not a complete "
                f"{arch} model (or the architecture is not supported)"
            )
        return value

    n_layer = int(need("block_count"))
    n_embd = int(need("embedding_length"))
    n_head = _per_layer(need("attention.head_count"), n_layer)
    n_head_kv = _per_layer(key("attention.head_count_kv", n_head), n_layer)
    n_head_0 = n_head if isinstance(n_head, int) else max(n_head)
    default_head_dim = n_embd // n_head_0 if n_head_0 else 0
    key_length = int(key("attention.key_length", default_head_dim))
    value_length = int(key("attention.value_length", default_head_dim))
    n_ff_raw = key("feed_forward_length")
    n_ff = None if n_ff_raw is None else _per_layer(n_ff_raw, n_layer)

    sliding_window = key("attention.sliding_window")
    sliding_window = int(sliding_window) if sliding_window else None
    swa_layers = _swa_layers(arch, key("attention.sliding_window_pattern"), sliding_window, n_layer)

    tokens = meta.get("tokenizer.ggml.tokens")
    by_name = {t.name: t for t in infos}
    if isinstance(tokens, _BigArray | list):
        n_vocab = tokens.count if isinstance(tokens, _BigArray) else len(tokens)
    elif key("vocab_size") is not None:
        n_vocab = int(key("vocab_size"))
    elif "token_embd.weight" in by_name:
        n_vocab = by_name["token_embd.weight"].shape[-1]
    else:
        n_vocab = 0

    layer_bytes = [0] * n_layer
    token_embd = output = output_norm = other = 0
    for t in infos:
        m = _BLOCK_RE.match(t.name)
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
    output_tied = "output.weight" not in by_name
    total = sum(t.nbytes for t in infos)

    template = meta.get("tokenizer.chat_template")
    return ModelFacts(
        arch=arch,
        name=meta.get("general.name") if isinstance(meta.get("general.name"), str) else None,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        key_length=key_length,
        value_length=value_length,
        n_ff=n_ff,
        sliding_window=sliding_window,
        swa_layers=swa_layers,
        n_ctx_train=int(key("context_length", 0)),
        n_vocab=int(n_vocab),
        file_type=_int_or_none(meta.get("general.file_type")),
        chat_template=template if isinstance(template, str) else None,
        bos_token_id=_int_or_none(meta.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_int_or_none(meta.get("tokenizer.ggml.eos_token_id")),
        layer_bytes=tuple(layer_bytes),
        token_embd_bytes=token_embd,
        output_bytes=output,
        output_tied=output_tied,
        output_norm_bytes=output_norm,
        other_bytes=other,
        total_tensor_bytes=total,
        tensor_data_offset=data_offset,
        file_size=cur.total,
        gguf_version=version,
        tensors=tuple(infos),
        metadata={k: v for k, v in meta.items() if not isinstance(v, _BigArray)},
    )


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _per_layer(value: Any, n_layer: int) -> int | tuple[int, ...]:
    """A hyperparameter that is one number, or one per layer (collapsed when all are equal)."""
    if isinstance(value, list):
        values = tuple(int(v) for v in value)
        if len(values) != n_layer:
            raise ModelError(f"per-layer array has {len(values)} entries for {n_layer} layers")
        return values[0] if len(set(values)) == 1 else values
    return int(value)


def _swa_layers(
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
