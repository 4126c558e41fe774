"""`POST /slots/{id}?action=save|restore|erase`: a slot's prompt to a file and back.

As llama-server with `--slot-save-path`: `save` writes the slot's KV cells and tokens to a file
of that folder (llama.cpp's own state file, so either server reads the other's), `restore`
puts a saved file back into a slot, `erase` empties a slot; the answers have llama-server's
shapes. A file name is a plain name in the folder: no separators, no `..`, nothing a file
system would take otherwise (llama.cpp's `fs_validate_filename`), and nothing in the folder
leads out of it: a name that is a symbolic link is refused (400), a save replaces the name
itself (written beside it, renamed into place), a restore reads only a regular file, and whole
before llama.cpp sees it (`engine.seq_file`: a file cut short is a 400, not an abort). A busy
slot answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from localfab.engine.seq_file import BadSeqFile
from localfab.server.errors import ApiError
from localfab.server.plumbing import json_response

if TYPE_CHECKING:
    from localfab.engine.kvcache import KVCache
    from localfab.server.state import Server

ACTIONS = ("save", "restore", "erase")
_FORBIDDEN = set('/\\:*?"<>|')


def valid_filename(name: str) -> bool:
    """Whether `name` is a plain file name, safe on any file system (llama.cpp's rules)."""
    raw = name.encode("utf-8", "surrogatepass")
    return (
        0 < len(raw) <= 255
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in name)
        and not any(ord(c) < 0x20 or ord(c) == 0x7F or c in _FORBIDDEN for c in name)
        and ".." not in name
        and name == name.strip(" ")
        and not name.endswith(".")
    )


async def slot_action(server: Server, request: Request) -> Response:
    folder = server.settings.slot_save_path
    if folder is None:
        raise ApiError(
            "This server does not support slots action. Start it with `--slot-save-path`",
            "not_supported_error",
        )
    try:
        id_slot = int(request.path_params["id_slot"])
    except ValueError:
        raise ApiError("Invalid slot ID") from None
    action = request.query_params.get("action", "")
    if action not in ACTIONS:
        raise ApiError("Invalid action")
    filename = ""
    if action != "erase":
        given = (await server.read_json(request)).get("filename")
        if not isinstance(given, str) or not valid_filename(given):
            raise ApiError("Invalid filename")
        filename = given

    def run(_model: Any) -> dict[str, Any]:
        kv = _idle_slot(server, id_slot)
        if action == "erase":
            n_erased = len(kv.cached)
            kv.clear()
            return {"id_slot": id_slot, "n_erased": n_erased}
        return (
            _save(kv, id_slot, folder, filename)
            if action == "save"
            else _restore(kv, id_slot, folder, filename)
        )

    return json_response(await asyncio.wrap_future(server.worker.call(run)))


def _idle_slot(server: Server, id_slot: int) -> KVCache:
    """The KV sequence of slot `id_slot` (on the engine thread, between steps)."""
    runner = server.worker.runner
    slots = runner.decoder.slots if runner is not None else []
    if not 0 <= id_slot < len(slots):
        raise ApiError("Invalid slot ID")
    if slots[id_slot].reply is not None:
        raise ApiError(
            f"slot {id_slot} is busy: try again when its reply ends", "unavailable_error"
        )
    return slots[id_slot].kv


def _save(kv: KVCache, id_slot: int, folder: Path, filename: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    n_saved = len(kv.cached)
    path = folder / filename
    _not_a_link(path)
    # Written to a new name and renamed over `filename`: a link planted meanwhile is replaced,
    # never written through, and a reader never sees half a file.
    tmp = folder / f".slot-save.{os.getpid()}.{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        with os.fdopen(os.open(tmp, flags, 0o644), "wb") as f:
            n_written = kv.save_file(f)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ApiError(
            f"Unable to save slot: {filename} ({exc.strerror or exc})", "server_error"
        ) from exc
    return {
        "id_slot": id_slot,
        "filename": filename,
        "n_saved": n_saved,
        "n_written": n_written,
        "timings": {"save_ms": (time.perf_counter() - t0) * 1e3},
    }


def _restore(kv: KVCache, id_slot: int, folder: Path, filename: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = _read_regular(folder / filename)
    try:
        n_read = kv.load_file(data)
    except BadSeqFile as exc:
        raise ApiError(
            f"Unable to restore slot: {filename}: {exc}",
            "invalid_request_error" if exc.cut_short else "server_error",
        ) from None
    return {
        "id_slot": id_slot,
        "filename": filename,
        "n_restored": len(kv.cached),
        "n_read": n_read,
        "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3},
    }


def _not_a_link(path: Path) -> None:
    if path.is_symlink():
        raise ApiError(
            f"{path.name} in --slot-save-path is a symbolic link: slot files are only read "
            "and written in the folder itself; remove the link or use another name"
        )


def _read_regular(path: Path) -> bytearray:
    """The bytes of `path`, a regular file in the folder: not through a symbolic link (O_NOFOLLOW
    checks the name and reads in one step), never a pipe or device (which could block)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _not_a_link(path)
        raise ApiError(
            "Unable to restore slot: No available space in KV cache or invalid slot save file "
            f"({path.name}: {exc.strerror or exc})",
            "server_error",
        ) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ApiError(f"Unable to restore slot: {path.name} is not a regular file")
        os.set_blocking(fd, True)
        data = bytearray(st.st_size)
        n = f.readinto(data)
    if n != len(data):
        raise ApiError(f"Unable to restore slot: {path.name} changed while it was read")
    return data
