"""Prompt states on disk: what the RAM tier keeps, kept across restarts and shared by processes.

A reopened chat, the next question about the same piped document, or a server restarted on the
same model finds its prompt's KV state in the cache folder and restores it instead of processing
the prompt again. One file per state, named by the state's key and its tokens:

    MAGIC | header length (4 bytes, little-endian) | header (JSON) | tokens (int32) | state

The header names what the state depends on (`StateKey`: the model file's identity and every
load setting that changes what the KV cells hold), the token count, the state's size and a
SHA-256 of tokens and state. A file whose key differs is never read; one that is truncated, does
not match its checksum or cannot be parsed (whatever its header holds) is deleted with a note,
never loaded; a folder full of them gets one line for them all. Only regular files are opened: a
pipe or device named like a state file is skipped, never waited on.

Files are written to a temporary name in the same folder and renamed into place, so a reader (the
app and `serve` may share the folder) sees a whole file or none. The folder is bounded in bytes:
the least recently used files go first (a restore touches its file). A full disk or any other
write error drops the state with a note; it never breaks a reply.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localfab.engine.cached import (
    MIN_TOKENS,
    CachedPrompt,
    begins_with,
    common_prefix,
    worth_taking,
)

if TYPE_CHECKING:
    from localfab.engine.types import EngineSettings

log = logging.getLogger("localfab.cache")

MAGIC = b"localfab-kv-state\n"
VERSION = 1
SUFFIX = ".lfkv"
# A few GiB by default: a reopened 8,000-token chat of a 0.5B model is ~100 MB, of an 8B ~1 GB.
DEFAULT_DISK_LIMIT = 4 << 30
# A temporary file this old was left by a writer that died: it is removed.
_STALE_TMP_S = 600.0
_HEAD = struct.Struct("<I")
# A header is a few hundred bytes; a longer one is not ours (and is not parsed).
_HEADER_MAX = 1 << 20

Note = Callable[[str], None]


def model_identity(path: Path) -> dict[str, Any]:
    """What names a model file's contents cheaply: its size and a hash of its first and last
    MiB (the GGUF header, tensor infos and the last weights). A copy of the file matches; a
    re-quantized or re-downloaded different file does not."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return {"name": path.name, "size": size, "sha256_ends": digest.hexdigest()}


@dataclass(frozen=True)
class StateKey:
    """What a saved state depends on: the model and the load settings that change KV contents
    or layout (cache types, flash attention, sliding-window size, context and sequence layout,
    llama.cpp's version). A state is only restored under an equal key."""

    model: dict[str, Any]
    settings: dict[str, Any]

    @property
    def id(self) -> str:
        text = json.dumps({"model": self.model, "settings": self.settings}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def state_key(path: Path, settings: EngineSettings, n_ctx_seq: int, n_seq_max: int) -> StateKey:
    """The key of an engine's states: the model file, and each setting that changes what the
    cells hold or how they are laid out (layers on the GPU and threads do not)."""
    import llama_cpp

    s = settings
    return StateKey(
        model_identity(path),
        {
            "llama_cpp": getattr(llama_cpp, "__version__", ""),
            "type_k": s.type_k,
            "type_v": s.type_v,
            "flash_attn": s.flash_attn,
            "swa_full": s.swa_full,
            "n_ctx_seq": n_ctx_seq,
            "n_seq_max": n_seq_max,
            "kv_unified": s.kv_unified,
        },
    )


@dataclass(frozen=True)
class DiskEntry:
    """A state file of our key: its tokens (read from its header) and its size on disk."""

    path: Path
    tokens: tuple[int, ...]
    size: int


class BadStateFile(Exception):
    """A state file that must not be loaded (the reason is the message)."""


def _tokens_id(tokens: Sequence[int]) -> str:
    return hashlib.sha256(array("i", tokens).tobytes()).hexdigest()[:20]


def encode(key: StateKey, tokens: Sequence[int], state: bytes | bytearray) -> list[bytes]:
    """A state file's bytes, in pieces (the state is not copied)."""
    raw_tokens = array("i", tokens).tobytes()
    digest = hashlib.sha256(raw_tokens)
    digest.update(state)
    header = json.dumps(
        {
            "version": VERSION,
            "key": {"model": key.model, "settings": key.settings},
            "key_id": key.id,
            "n_tokens": len(tokens),
            "state_bytes": len(state),
            "sha256": digest.hexdigest(),
            "written": time.time(),
        },
        sort_keys=True,
    ).encode()
    return [MAGIC, _HEAD.pack(len(header)), header, raw_tokens, bytes(state)]


def read_header(f: Any, key_id: str) -> tuple[dict[str, Any], tuple[int, ...]]:
    """A state file's header and tokens (the file positioned at its state); `BadStateFile`
    when it is not a whole state file of this key. Every field is checked against the file's
    size before it is used, so a damaged header never asks for more than the file holds."""
    size = os.fstat(f.fileno()).st_size
    if f.read(len(MAGIC)) != MAGIC:
        raise BadStateFile("not a localfab state file")
    raw = f.read(_HEAD.size)
    if len(raw) != _HEAD.size:
        raise BadStateFile("truncated header")
    (n,) = _HEAD.unpack(raw)
    if n > min(_HEADER_MAX, size):
        raise BadStateFile("header longer than the file")
    try:
        header = json.loads(f.read(n))
    except (ValueError, RecursionError) as exc:
        raise BadStateFile(f"unreadable header ({exc})") from exc
    if not isinstance(header, dict):
        raise BadStateFile("unreadable header (not an object)")
    if header.get("version") != VERSION:
        raise BadStateFile(f"format version {header.get('version')!r}")
    if header.get("key_id") != key_id:
        raise BadStateFile("written for another model or load")
    digest = header.get("sha256")
    if not isinstance(digest, str) or len(digest) != 64:
        raise BadStateFile("unreadable header (no checksum)")
    n_tokens, state_bytes = _count(header, "n_tokens"), _count(header, "state_bytes")
    rest = size - f.tell()
    if 4 * n_tokens + state_bytes != rest:
        raise BadStateFile(
            f"truncated or overlong ({rest} bytes after the header, which says {n_tokens} "
            f"tokens and {state_bytes} bytes of state)"
        )
    tokens = array("i")
    raw_tokens = f.read(4 * n_tokens)
    if len(raw_tokens) != 4 * n_tokens:
        raise BadStateFile("truncated tokens")
    tokens.frombytes(raw_tokens)
    return header, tuple(tokens)


def _count(header: dict[str, Any], name: str) -> int:
    """A header field that must be a count (JSON's true is not one)."""
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadStateFile(f"unreadable header ({name} is {value!r})")
    return value


class NotRegular(OSError):
    """A name in the cache folder that is not a regular file (a pipe, a device, a folder)."""


def open_regular(path: Path) -> Any:
    """`path` opened for reading, only if it is a regular file: opening a pipe would wait for
    a writer, and the engine thread must never wait on the cache folder."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(f"{path.name} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@dataclass
class DiskCache:
    """The cache folder's states for one key, within `limit` bytes for the whole folder."""

    folder: Path
    key: StateKey
    limit: int = DEFAULT_DISK_LIMIT
    note: Note = field(default=lambda text: log.warning("%s", text))
    # Parsed headers by file name, valid while the file's (size, mtime) are unchanged.
    _index: dict[str, tuple[tuple[int, int], tuple[int, ...]]] = field(default_factory=dict)
    # Names already reported as not regular files (left where they are), with their inode.
    _strange: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    written_bytes: int = 0
    write_seconds: float = 0.0

    @property
    def key_id(self) -> str:
        return self.key.id

    # --- lookup ---------------------------------------------------------------------------------

    def entries(self) -> list[DiskEntry]:
        """The whole state files of this key now in the folder (headers read once each).
        Files that are not are skipped: damaged ones removed, others left, and each reported
        once (one line for a whole scan's worth)."""
        out: list[DiskEntry] = []
        prefix = self.key_id + "-"
        try:
            names = [n for n in os.listdir(self.folder) if n.endswith(SUFFIX)]
        except OSError:
            return out
        skipped: list[tuple[str, str]] = []
        with self._lock:
            for name in names:
                if not name.startswith(prefix):
                    continue
                path = self.folder / name
                try:
                    st = path.stat()
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    if self._strange.get(name) != st.st_ino:
                        self._strange[name] = st.st_ino
                        skipped.append((name, "not a regular file, left as it is"))
                    continue
                # A rewrite is a new file (renamed into place): a new inode. A restore's touch
                # changes only the mtime, so it does not make the header be read again.
                stamp = (st.st_size, st.st_ino)
                known = self._index.get(name)
                if known is None or known[0] != stamp:
                    tokens = self._read_tokens(path, skipped)
                    if tokens is None:
                        continue
                    known = self._index[name] = (stamp, tokens)
                out.append(DiskEntry(path, known[1], st.st_size))
        self._report(skipped)
        return out

    def _read_tokens(self, path: Path, skipped: list[tuple[str, str]]) -> tuple[int, ...] | None:
        try:
            with open_regular(path) as f:
                return read_header(f, self.key_id)[1]
        except BadStateFile as exc:
            self._remove(path)
            skipped.append((path.name, f"{exc}, removed"))
        except NotRegular:
            skipped.append((path.name, "not a regular file, left as it is"))
        except OSError:
            pass  # removed meanwhile (another process evicted it)
        return None

    def _report(self, skipped: list[tuple[str, str]]) -> None:
        """One line for what a scan skipped: the file and why, or how many and the first."""
        if len(skipped) == 1:
            name, why = skipped[0]
            self.note(f"prompt cache: skipped {name} ({why})")
        elif skipped:
            name, why = skipped[0]
            self.note(
                f"prompt cache: skipped {len(skipped)} files in {self.folder} that are not "
                f"cache files of this model (the first: {name}, {why})"
            )

    def find(self, prompt: Sequence[int], have: int) -> tuple[DiskEntry, int] | None:
        """The state file holding the longest beginning of `prompt` (more than `have` tokens,
        keeping at least `MIN_KEEP` of it), with that length; None when none is worth it."""
        best: tuple[DiskEntry, int] | None = None
        best_lcp = have
        for entry in self.entries():
            lcp = common_prefix(entry.tokens, prompt)
            if worth_taking(lcp, len(entry.tokens), best_lcp):
                best, best_lcp = (entry, lcp), lcp
        return best

    def load(self, entry: DiskEntry) -> CachedPrompt | None:
        """The state in `entry`'s file, checked whole; None (and the file gone, with a note)
        when it is truncated or corrupt, whatever its header says."""
        try:
            with open_regular(entry.path) as f:
                header, tokens = read_header(f, self.key_id)
                state = bytearray(header["state_bytes"])
                if f.readinto(state) != len(state) or f.read(1):
                    raise BadStateFile("truncated or overlong state")
            digest = hashlib.sha256(array("i", tokens).tobytes())
            digest.update(state)
            if digest.hexdigest() != header["sha256"]:
                raise BadStateFile("checksum mismatch")
        except BadStateFile as exc:
            self.discard(entry.path, str(exc))
            return None
        except NotRegular:
            self.note(f"prompt cache: skipped {entry.path.name} (not a regular file)")
            return None
        except OSError:
            return None
        _touch(entry.path)
        return CachedPrompt(tokens, state, source=entry.path)

    def discard(self, path: Path, why: str) -> None:
        self.note(f"prompt cache: discarded {path.name} ({why})")
        self._remove(path)

    def _remove(self, path: Path) -> None:
        self._index.pop(path.name, None)
        with suppress(OSError):
            path.unlink()

    # --- writing --------------------------------------------------------------------------------

    def covered(self, tokens: Sequence[int]) -> bool:
        """Whether a file already holds `tokens` (or a longer prompt beginning with them)."""
        return any(begins_with(e.tokens, tokens) for e in self.entries())

    def store(self, tokens: Sequence[int], state: bytes | bytearray, *, new: bool = False) -> int:
        """Write a state file for `tokens` (crash-safe: a temporary file renamed into place),
        drop the files it extends and the least recently used ones over the limit; the bytes
        written, 0 when nothing was (already there, over the limit, or a write error: noted).
        `new`: the caller has just seen that no file holds them (the folder is not listed again)."""
        if len(tokens) < MIN_TOKENS or (not new and self.covered(tokens)):
            return 0
        pieces = encode(self.key, tokens, state)
        size = sum(len(p) for p in pieces)
        if size > self.limit:
            return 0
        name = f"{self.key_id}-{_tokens_id(tokens)}{SUFFIX}"
        final = self.folder / name
        tmp = self.folder / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        t0 = time.perf_counter()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._make_room(size)
            with tmp.open("wb") as f:
                for piece in pieces:
                    f.write(piece)
            os.replace(tmp, final)
        except OSError as exc:
            with suppress(OSError):
                tmp.unlink()
            self.note(
                f"prompt cache: could not write a state to {self.folder} ({exc.strerror or exc}); "
                "the reply is unaffected, free some disk space to keep prompts across restarts"
            )
            return 0
        self.write_seconds += time.perf_counter() - t0
        self.written_bytes += size
        self._drop_extended(tokens, keep=final)
        return size

    def _drop_extended(self, tokens: Sequence[int], keep: Path) -> None:
        """Files of shorter prompts that `tokens` begins with: the new file holds them too."""
        for e in self.entries():
            if e.path != keep and begins_with(tokens, e.tokens):
                with suppress(OSError):
                    e.path.unlink()

    def _make_room(self, incoming: int) -> None:
        """Remove the least recently used state files (of any key) until `incoming` more bytes
        fit the limit; temporary files of writers that died go too."""
        files: list[tuple[float, int, Path]] = []
        now = time.time()
        for path in _listing(self.folder):
            try:
                st = path.stat()
            except OSError:
                continue
            if path.name.endswith(".tmp"):
                if now - st.st_mtime > _STALE_TMP_S:
                    with suppress(OSError):
                        path.unlink()
                continue
            files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total + incoming <= self.limit:
                break
            with suppress(OSError):
                path.unlink()
            total -= size

    @property
    def nbytes(self) -> int:
        """Bytes of state files in the folder (all keys)."""
        total = 0
        for path in _listing(self.folder):
            with suppress(OSError):
                total += path.stat().st_size
        return total


def _listing(folder: Path) -> Iterable[Path]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [folder / n for n in names if n.endswith((SUFFIX, ".tmp"))]


def _touch(path: Path) -> None:
    """Mark a file as used now (the disk tier's LRU order is the files' mtimes)."""
    with suppress(OSError):
        os.utime(path)
