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

import math
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

from localfab.errors import ModelCorrupt, ModelError
from localfab.modelfile import check_model_file, permission_denied

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

# Sanity bounds that tell a corrupt header from a real one, and keep a hostile header (local or
# remote) from costing more than a bounded amount of memory and bytes fetched. Real headers have a
# few hundred keys, at most tens of thousands of tensors (MoE models stored one tensor per
# expert), and are a few MB long (a 262k-token vocabulary is 6.5 MB); a string longer than 64 MiB
# (chat templates are tens of KiB) means the length field is garbage.
_MAX_KV = 1 << 16
_MAX_TENSORS = 1 << 17
_MAX_STRING = 64 << 20
_MAX_HEADER = 128 << 20
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_ELEMENTS = 2**63 - 1  # int64_t, as ggml counts a tensor's elements
# Smallest encodings, to tell whether a declared count can fit in the bytes that are left:
# a metadata pair is a key (u64 length) + value type (u32) + at least one byte of value; a
# tensor info is a name (u64 length) + n_dims (u32) + one dim (u64) + type (u32) + offset (u64).
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8

# llama.cpp keeps hyperparameters in uint32 fields and per-layer ones in arrays of
# LLAMA_MAX_LAYERS (src/llama-hparams.h); it refuses a model with more layers or experts.
MAX_LAYERS = 512
MAX_EXPERTS = 1024
_U32_MAX = 2**32 - 1

# Architectures without attention (pure state-space models): their headers say 0 heads.
_ATTENTION_FREE = frozenset({"mamba", "mamba2"})

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


class _Truncated(ModelError):
    """The file (or what the server sent) ended inside the header."""


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
        return _Truncated(
            f"{self.label}: GGUF header truncated at byte {offset} while reading {self.what}"
            f"{size}: the file is incomplete; download it again"
        )

    def corrupt(self, offset: int, problem: str) -> ModelError:
        return ModelCorrupt(
            f"{self.label}: corrupt GGUF header at byte {offset} ({self.what}): {problem}; "
            f"the file is damaged or not a model; download it again"
        )

    def check_count(self, at: int, count: int, min_bytes: int, what: str) -> None:
        """Refuse a declared count whose smallest encoding is longer than what is left.

        Longer than any real header: corrupt. Longer than the rest of the file: truncated.
        Either way nothing is fetched or allocated for it.
        """
        need = count * min_bytes
        if self.pos + need > _MAX_HEADER:
            raise self.corrupt(
                at, f"{count} {what} would make the header longer than {_MAX_HEADER >> 20} MiB"
            )
        if self.total is not None and self.pos + need > self.total:
            raise self.truncated(self.total)

    # reading ------------------------------------------------------------------------------
    def _fill(self, need: int) -> None:
        """Make buf cover [pos, pos + need)."""
        want = max(need, self.chunk)
        self.chunk = min(self.chunk * 2, self.max_chunk)
        if self.total is not None:
            if self.pos + need > self.total:
                raise self.truncated(self.total)
            want = min(want, self.total - self.pos)
        if self.pos + need > _MAX_HEADER:
            # No real header comes near this; a remote one must not make us fetch gigabytes.
            raise self.corrupt(self.pos, f"the header runs past {_MAX_HEADER >> 20} MiB")
        want = min(want, _MAX_HEADER - self.pos)
        try:
            data = self.source.read(self.pos, want)
        except PermissionError as exc:
            raise permission_denied(self.label) from exc
        except OSError as exc:
            raise ModelError(
                f"{self.label}: cannot read byte {self.pos} ({exc.strerror or exc}): check the "
                f"disk or the network and try again"
            ) from exc
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
        self.check_count(self.pos, count, 8, "strings")
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
            cur.check_count(at, count, item_size, "array items")
            if count > MAX_KEPT_ARRAY:
                cur.skip(count * item_size)
                return _BigArray(item_type, count)
            raw = cur.take(count * item_size)
            return list(struct.unpack_from(f"<{count}{item_fmt}", raw))
        if item_type == GGUFValueType.STRING:
            if count > MAX_KEPT_ARRAY:
                cur.skip_strings(count)
                return _BigArray(item_type, count)
            cur.check_count(at, count, 8, "strings")
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
    if math.prod(shape) > _MAX_ELEMENTS:
        # ggml counts elements in int64: a larger shape is garbage, and its byte count would
        # overflow every float the planner prints it with.
        raise cur.corrupt(at, f"tensor {name!r} has the impossible shape {list(shape)}")
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
        check_model_file(path)
        return FileSource(path), str(path)
    if isinstance(path_or_source, RangeSource):
        return path_or_source, getattr(path_or_source, "label", None) or repr(path_or_source)
    raise TypeError(f"read_facts needs a path or a RangeSource, not {type(path_or_source)!r}")


_TensorHeader = tuple[str, int, tuple[int, ...], int, int]  # name, type, shape, offset, at


def _read_preamble(cur: _Cursor, label: str) -> tuple[int, int, int]:
    """Magic, version and counts: (version, tensor count, metadata count)."""
    cur.what = "the magic number"
    if cur.total is not None and cur.total < 4:
        raise ModelError(f"{label} is not a GGUF file ({cur.total} bytes long)")
    try:
        magic_raw = bytes(cur.take(4))
    except _Truncated:
        # Only a short read means "too short"; a permission or I/O error keeps its own message.
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
    cur.check_count(16, n_kv, _MIN_KV_BYTES, "metadata entries")
    cur.check_count(8, n_tensors, _MIN_TENSOR_INFO_BYTES, "tensor infos")
    return version, n_tensors, n_kv


def _read_metadata(cur: _Cursor, n_kv: int) -> dict[str, Any]:
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
    return meta


def _read_tensor_headers(cur: _Cursor, n_tensors: int) -> list[_TensorHeader]:
    tensors: list[_TensorHeader] = []
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
    return tensors


def _alignment(cur: _Cursor, meta: Mapping[str, Any]) -> int:
    alignment = meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise cur.corrupt(0, f"general.alignment {alignment!r} is not a power of two")
    return alignment


def _tensor_infos(
    cur: _Cursor, label: str, tensors: list[_TensorHeader], alignment: int, data_offset: int
) -> list[TensorInfo]:
    """Sizes of the tensors, each checked to be aligned and to fit in the file."""
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
    return infos


def read_facts(path_or_source: str | os.PathLike[str] | RangeSource) -> ModelFacts:
    """Parse the GGUF header of a local file or of any `RangeSource` into `ModelFacts`.

    Raises `ModelError` when the file is missing, is not GGUF, or its header is truncated or
    corrupt; the message names the byte offset and what to do.
    """
    source, label = _source_and_label(path_or_source)
    cur = _Cursor(source, label)
    version, n_tensors, n_kv = _read_preamble(cur, label)
    meta = _read_metadata(cur, n_kv)
    tensors = _read_tensor_headers(cur, n_tensors)
    alignment = _alignment(cur, meta)
    data_offset = -(-cur.pos // alignment) * alignment
    infos = _tensor_infos(cur, label, tensors, alignment, data_offset)
    try:
        return _facts(meta, infos, label=label, cur=cur, version=version, data_offset=data_offset)
    except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
        # The checks in _facts name the key at fault; this is the net under them.
        raise ModelCorrupt(
            f"model file {label} is corrupt: {exc}; download it again or get it from its source"
        ) from exc


def _describe(value: Any) -> str:
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
    if isinstance(value, _BigArray):
        return f"an array of {value.count} items"
    return f"{value!r}"


class _Checker:
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
            raise self.bad(name, f"{what}is {_describe(value)}, not an integer")
        if not low <= value <= high:
            raise self.bad(name, f"{what}is {value}, outside {low}..{high}")
        return value

    def count(self, name: str, *, low: int = 1, high: int = _U32_MAX, default: Any = None) -> Any:
        """An integer key in [low, high]; `default` (unchecked) when the key is absent."""
        value = self.get(name)
        if value is None:
            return default
        return self.int_value(name, value, low, high)

    def per_layer(
        self, name: str, value: Any, n_layer: int, *, low: int, high: int = _U32_MAX
    ) -> int | tuple[int, ...]:
        """One number, or one per layer (collapsed when all are equal)."""
        if isinstance(value, _BigArray):  # longer than MAX_KEPT_ARRAY, so than MAX_LAYERS
            raise self.bad(name, f"has {value.count} per-layer entries for {n_layer} layers")
        if isinstance(value, list):
            if len(value) != n_layer:
                raise self.bad(name, f"has {len(value)} per-layer entries for {n_layer} layers")
            values = tuple(
                self.int_value(name, v, low, high, what=f"entry {i} ") for i, v in enumerate(value)
            )
            return values[0] if len(set(values)) == 1 else values
        return self.int_value(name, value, low, high)


def _layer_count(c: _Checker, infos: list[TensorInfo]) -> int:
    """`block_count`, bounded by llama.cpp's MAX_LAYERS and by the blk.N tensors present.

    Everything per layer is sized by this number, so it is bounded before anything is
    allocated from it.
    """
    c.need("block_count")
    n_layer: int = c.count("block_count", high=MAX_LAYERS)
    blocks = [int(m.group(1)) for t in infos if (m := _BLOCK_RE.match(t.name))]
    if blocks and n_layer > max(blocks) + 1:
        raise c.bad(
            "block_count",
            f"says {n_layer} layers but the file holds tensors for {max(blocks) + 1} "
            f"(blk.0 to blk.{max(blocks)})",
        )
    return n_layer


def _largest(value: int | tuple[int, ...]) -> int:
    return value if isinstance(value, int) else max(value)


def _heads(c: _Checker, n_layer: int) -> tuple[int | tuple[int, ...], int | tuple[int, ...], int]:
    """(n_head, n_head_kv, the largest n_head).

    A per-layer array may hold 0 for layers without attention (hybrid models), but some layer
    must have heads, unless the architecture has no attention at all.
    """
    n_head = c.per_layer("attention.head_count", c.need("attention.head_count"), n_layer, low=0)
    n_head_max = _largest(n_head)
    if n_head_max == 0 and c.arch not in _ATTENTION_FREE:
        raise c.bad("attention.head_count", "is 0: a model with attention needs heads")
    kv_raw = c.get("attention.head_count_kv")
    n_head_kv = (
        n_head if kv_raw is None else c.per_layer("attention.head_count_kv", kv_raw, n_layer, low=0)
    )
    if _largest(n_head_kv) == 0 and n_head_max > 0:
        raise c.bad("attention.head_count_kv", "is 0: a model with attention needs KV heads")
    return n_head, n_head_kv, n_head_max


def _head_lengths(c: _Checker, n_embd: int, n_head_max: int) -> tuple[int, int]:
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


def _check_experts(c: _Checker, n_layer: int) -> None:
    """Mixture of experts: not planned with yet, but a file whose counts llama.cpp refuses
    (more experts than it supports, more used per token than there are) is not a model."""
    n_expert = c.count("expert_count", low=0, high=MAX_EXPERTS, default=0)
    used = c.get("expert_used_count")
    if used is None:
        return
    n_used_max = _largest(c.per_layer("expert_used_count", used, n_layer, low=0))
    if n_used_max > n_expert:
        raise c.bad("expert_used_count", f"is {n_used_max}, more than the {n_expert} experts")
    if n_expert and not n_used_max:
        raise c.bad("expert_used_count", f"is 0 with {n_expert} experts")


def _sliding_window(c: _Checker, n_layer: int) -> tuple[int | None, tuple[bool, ...]]:
    """(sliding window size or None, which layers use it)."""
    window = c.count("attention.sliding_window", low=0)
    sliding_window = window or None
    pattern = c.get("attention.sliding_window_pattern")
    if isinstance(pattern, list | _BigArray):
        n = len(pattern) if isinstance(pattern, list) else pattern.count
        if isinstance(pattern, _BigArray) or n != n_layer:
            raise c.bad("attention.sliding_window_pattern", f"has {n} entries for {n_layer} layers")
        if not all(isinstance(p, bool | int) for p in pattern):
            raise c.bad("attention.sliding_window_pattern", "holds values that are not flags")
    elif pattern is not None:
        c.int_value("attention.sliding_window_pattern", pattern, 0, _U32_MAX)
    return sliding_window, _swa_layers(c.arch, pattern, sliding_window, n_layer)


def _corrupt(label: str, problem: str) -> ModelCorrupt:
    return ModelCorrupt(
        f"model file {label} is corrupt: {problem}; download it again or get it from its source"
    )


def _token_list_size(tokens: Any, label: str) -> int:
    """The length of `tokenizer.ggml.tokens`, which must be a non-empty array of strings."""
    if isinstance(tokens, _BigArray):
        n_vocab, is_strings = tokens.count, tokens.item_type == GGUFValueType.STRING
    elif isinstance(tokens, list):
        n_vocab, is_strings = len(tokens), all(isinstance(t, str) for t in tokens)
    else:
        n_vocab, is_strings = 0, False
    if not is_strings:
        raise _corrupt(
            label, f"tokenizer.ggml.tokens is {_describe(tokens)}, not an array of strings"
        )
    if n_vocab < 1:
        raise _corrupt(label, "tokenizer.ggml.tokens is empty")
    return n_vocab


def _vocab_size(
    meta: Mapping[str, Any], c: _Checker, by_name: Mapping[str, TensorInfo], label: str
) -> int:
    """The token list's length, else vocab_size, else the embedding's width; 0 if none."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is not None:
        return _token_list_size(tokens, label)
    if c.get("vocab_size") is not None:
        return int(c.count("vocab_size"))
    if "token_embd.weight" in by_name:
        n_vocab = by_name["token_embd.weight"].shape[-1]
        if n_vocab < 1:
            raise _corrupt(label, "token_embd.weight has an empty vocabulary dimension")
        return n_vocab
    return 0


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
    return _TensorBytes(tuple(layer_bytes), token_embd, output, output_norm, other)


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
    c = _Checker(meta, label, arch)
    by_name = {t.name: t for t in infos}
    n_layer = _layer_count(c, infos)
    n_embd = c.int_value("embedding_length", c.need("embedding_length"), 1, _U32_MAX)
    n_head, n_head_kv, n_head_max = _heads(c, n_layer)
    key_length, value_length = _head_lengths(c, n_embd, n_head_max)
    n_ff_raw = c.get("feed_forward_length")
    n_ff = (
        None if n_ff_raw is None else c.per_layer("feed_forward_length", n_ff_raw, n_layer, low=0)
    )
    _check_experts(c, n_layer)
    sliding_window, swa_layers = _sliding_window(c, n_layer)
    n_ctx_train = c.count("context_length", default=0)
    n_vocab = _vocab_size(meta, c, by_name, label)
    sizes = _tensor_bytes(infos, n_layer)
    name = meta.get("general.name")
    template = meta.get("tokenizer.chat_template")
    return ModelFacts(
        arch=arch,
        name=name if isinstance(name, str) else None,
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
        chat_template=template if isinstance(template, str) else None,
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
        file_size=cur.total,
        gguf_version=version,
        tensors=tuple(infos),
        metadata={k: v for k, v in meta.items() if not isinstance(v, _BigArray)},
    )


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


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
