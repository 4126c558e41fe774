"""llama.cpp's sequence state file (a server slot's save), read and written without llama.cpp
touching the file.

llama.cpp's own reader (`llama_state_seq_load_file`) reads past the end of a file cut short and
then aborts the whole process on an assertion; it also opens whatever the path names (a symbolic
link, a pipe). So the file is read here, checked against what its header says, and its state is
handed to llama.cpp as a buffer (`llama_state_seq_set_data`), whose reader checks every read
against the buffer's end. The layout, as `llama_state_seq_save_file` writes it:

    magic 'ggsq' (u32) | version (u32) | n_tokens (u32) | tokens (i32 each) | state

where the state is what `llama_state_seq_get_data` gives after its own framing (a magic and the
sequence id, `FRAMING` bytes). Files written here are byte for byte llama.cpp's (and
llama-server's slot files): either reads the other's.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from localfab.errors import LocalfabError

MAGIC = 0x67677371  # LLAMA_STATE_SEQ_MAGIC ('ggsq')
VERSION = 3  # LLAMA_STATE_SEQ_VERSION
HEAD = struct.Struct("<III")
# What `llama_state_seq_get_data` puts before the state it shares with the file.
FRAMING = 8


class BadSeqFile(LocalfabError):
    """A file that is not a whole sequence state llama.cpp could read (the reason is the
    message); `cut_short` when it is a state file with bytes missing at its end."""

    def __init__(self, message: str, *, cut_short: bool = False) -> None:
        super().__init__(message)
        self.cut_short = cut_short


@dataclass(frozen=True)
class SeqFile:
    """A parsed file: its tokens and where its state begins."""

    tokens: tuple[int, ...]
    state_offset: int


def head(tokens: Sequence[int]) -> bytes:
    """The bytes before the state: magic, version, token count, tokens."""
    return HEAD.pack(MAGIC, VERSION, len(tokens)) + array("i", tokens).tobytes()


def parse_head(data: bytes | bytearray | memoryview, *, capacity: int) -> SeqFile:
    """The tokens of a file's head; `BadSeqFile` when it is not one of ours to read, is cut
    short before its state, or holds more tokens than `capacity`."""
    size = len(data)
    if size < HEAD.size:
        raise BadSeqFile(f"it is not a slot save file ({size} bytes, shorter than its header)")
    magic, version, n = HEAD.unpack_from(data)
    if magic != MAGIC:
        raise BadSeqFile("it is not a slot save file (no llama.cpp sequence state magic)")
    if version != VERSION:
        raise BadSeqFile(
            f"it was saved by another llama.cpp (format version {version}, this one reads "
            f"{VERSION})"
        )
    end = HEAD.size + 4 * n
    if end > size:
        raise BadSeqFile(
            f"it is cut short: {size} bytes, its header names {n} tokens ({end} bytes) and a "
            "state after them",
            cut_short=True,
        )
    if n > capacity:
        raise BadSeqFile(f"its prompt of {n} tokens does not fit the slot's {capacity}")
    tokens = array("i")
    tokens.frombytes(bytes(data[HEAD.size : end]))
    return SeqFile(tuple(tokens), end)


def missing_bytes(state: bytes | bytearray | memoryview) -> int:
    """How many bytes the KV cache layout written in `state` needs past its end (> 0: the state
    is cut short); 0 when it is whole or its layout is not one this reads (a recurrent or
    hybrid model's, cells with extra fields). Only used to say why llama.cpp refused a state,
    never to refuse one itself.

    The layout is `llama_kv_cache::state_write` of one sequence, once per cache (twice for a
    sliding-window model): streams, each with its cells' positions and sequence ids, then per
    layer the keys' rows and the values' rows (or, transposed, their elements).
    """
    reader = _Reader(memoryview(state))
    try:
        while reader.at < reader.size:  # one cache after another
            n_stream = reader.take("<I")
            if not 1 <= n_stream <= 256:
                return 0
            for _ in range(n_stream):
                if not _stream(reader):
                    return 0
    except _Short as short:
        return short.needed - reader.size
    return 0


def _stream(reader: _Reader) -> bool:
    """Skip one stream's cells and rows; False when they are not laid out as this reads."""
    cells = reader.take("<I")
    if cells == 0:
        return True
    if cells > 1 << 24:
        return False
    for _ in range(cells):
        reader.take("<i")  # position
        if reader.take("<I") != 1:  # one sequence id per cell, or not a layout read here
            return False
        reader.take("<i")
    v_trans, n_layer = reader.take("<I"), reader.take("<I")
    if v_trans > 1 or not 1 <= n_layer <= 4096:
        return False
    for _ in range(n_layer):  # keys: type, row size, the rows
        reader.take("<i")
        reader.skip(cells * reader.take("<Q"))
    for _ in range(n_layer):  # values: by row, or transposed by element
        reader.take("<i")
        if v_trans:
            size_el, n_embd = reader.take("<I"), reader.take("<I")
            reader.skip(n_embd * cells * size_el)
        else:
            reader.skip(cells * reader.take("<Q"))
    return True


class _Short(Exception):
    def __init__(self, needed: int) -> None:
        self.needed = needed


class _Reader:
    """Little-endian fields from a buffer; `_Short` with the bytes needed past its end."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.size = len(view)
        self.at = 0

    def take(self, fmt: str) -> int:
        n = struct.calcsize(fmt)
        if self.at + n > self.size:
            raise _Short(self.at + n)
        (value,) = struct.unpack_from(fmt, self.view, self.at)
        self.at += n
        return int(value)

    def skip(self, n: int) -> None:
        self.at += n
        if self.at > self.size:
            raise _Short(self.at)
