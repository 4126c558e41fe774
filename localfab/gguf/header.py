"""Reading a GGUF header: the byte-level parser under `localfab.gguf.facts`.

Every read goes through a `RangeSource` (`read(offset, size)` and `size()`), in buffered chunks
that grow as the header turns out to be long, so a remote header costs a handful of ranged
requests; fixed-size arrays (token scores, token types) are skipped without being fetched. The
result is the raw metadata (key -> value) and the tensor infos, each bounded and checked; what
the values mean is `facts_hparams`' and `facts`' business.

GGUF layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): magic "GGUF", version
(u32), tensor count (u64), metadata count (u64), the metadata pairs (key string, value type u32,
value), the tensor infos (name, n_dims u32, dims u64 each, ggml type u32, offset u64), then
padding to `general.alignment` (default 32) and the tensor data.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
)

from localfab.errors import ModelCorrupt, ModelError
from localfab.gguf.modelfile import not_gguf, permission_denied
from localfab.units import format_bytes

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


class Truncated(ModelError):
    """The file (or what the server sent) ended inside the header, at byte `end`."""

    def __init__(self, message: str, *, end: int) -> None:
        super().__init__(message)
        self.end = end


@dataclass(frozen=True)
class BigArray:
    """Stand-in for an array too long to keep: its element type and length."""

    item_type: int
    count: int


class Cursor:
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
        return Truncated(
            f"{self.label}: GGUF header truncated at byte {offset} while reading {self.what}"
            f"{size}: the file is incomplete; download it again",
            end=offset,
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
                at, f"{count} {what} would make the header longer than {format_bytes(_MAX_HEADER)}"
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
            raise self.corrupt(self.pos, f"the header runs past {format_bytes(_MAX_HEADER)}")
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


def read_value(cur: Cursor, vtype: int) -> Any:
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
                return BigArray(item_type, count)
            raw = cur.take(count * item_size)
            return list(struct.unpack_from(f"<{count}{item_fmt}", raw))
        if item_type == GGUFValueType.STRING:
            if count > MAX_KEPT_ARRAY:
                cur.skip_strings(count)
                return BigArray(item_type, count)
            cur.check_count(at, count, 8, "strings")
            return [cur.string() for _ in range(count)]
        raise cur.corrupt(at, f"unknown array item type {item_type}")
    raise cur.corrupt(cur.pos - 4, f"unknown value type {vtype}")


def tensor_nbytes(cur: Cursor, at: int, name: str, ggml_type: int, shape: tuple[int, ...]) -> int:
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


TensorHeader = tuple[str, int, tuple[int, ...], int, int]  # name, type, shape, offset, at


def read_preamble(cur: Cursor, label: str) -> tuple[int, int, int]:
    """Magic, version and counts: (version, tensor count, metadata count)."""
    cur.what = "the magic number"
    if cur.total is not None and cur.total < 4:
        raise not_gguf(label, cur.total)
    try:
        magic_raw = bytes(cur.take(4))
    except Truncated as exc:
        # Only a short read means "too short"; a permission or I/O error keeps its own message.
        raise not_gguf(label, exc.end) from None
    if struct.unpack("<I", magic_raw)[0] != GGUF_MAGIC:
        raise not_gguf(label, magic_raw)
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


def read_metadata(cur: Cursor, n_kv: int) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for i in range(n_kv):
        cur.what = f"metadata entry {i} of {n_kv}"
        key = cur.string()
        cur.what = f"metadata value {key!r}"
        at = cur.pos
        vtype = cur.u32()
        if key in meta:
            raise cur.corrupt(at, f"metadata key {key!r} appears twice")
        meta[key] = read_value(cur, vtype)
    return meta


def read_tensor_headers(cur: Cursor, n_tensors: int) -> list[TensorHeader]:
    tensors: list[TensorHeader] = []
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


def alignment_of(cur: Cursor, meta: Mapping[str, Any]) -> int:
    alignment = meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise cur.corrupt(0, f"general.alignment {alignment!r} is not a power of two")
    return alignment


def tensor_infos(
    cur: Cursor, label: str, tensors: list[TensorHeader], alignment: int, data_offset: int
) -> list[TensorInfo]:
    """Sizes of the tensors, each checked to be aligned and to fit in the file."""
    cur.what = "the tensor infos"
    infos: list[TensorInfo] = []
    for name, ggml_type, shape, offset, at in tensors:
        nbytes = tensor_nbytes(cur, at, name, ggml_type, shape)
        if offset % alignment:
            raise cur.corrupt(at, f"tensor {name!r} offset {offset} is not {alignment}-aligned")
        if cur.total is not None and data_offset + offset + nbytes > cur.total:
            raise ModelError(
                f"{label}: tensor {name!r} ends at byte {data_offset + offset + nbytes} but the "
                f"file is {cur.total} bytes: the file is truncated; download it again"
            )
        infos.append(TensorInfo(name, ggml_type, shape, offset, nbytes))
    return infos


@dataclass(frozen=True)
class Header:
    """A whole GGUF header: its version, metadata, tensor infos and where the data starts."""

    version: int
    meta: dict[str, Any]
    infos: list[TensorInfo]
    data_offset: int


def read_header(cur: Cursor, label: str) -> Header:
    """The header `cur` reads, every part checked (`ModelError` says what is wrong)."""
    version, n_tensors, n_kv = read_preamble(cur, label)
    meta = read_metadata(cur, n_kv)
    tensors = read_tensor_headers(cur, n_tensors)
    alignment = alignment_of(cur, meta)
    data_offset = -(-cur.pos // alignment) * alignment
    infos = tensor_infos(cur, label, tensors, alignment, data_offset)
    return Header(version, meta, infos, data_offset)
