"""Is this path a model file localfab can read? One set of checks and messages for every caller.

Light on purpose (no gguf, no numpy): the store, the command line and the engine all call it
before anything opens the file, so a FIFO never blocks a read and each failure names its fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from localfab.errors import ModelError

GGUF_MAGIC = b"GGUF"


def permission_denied(label: str) -> ModelError:
    return ModelError(
        f"{label}: permission denied: localfab may not read this file; make it readable "
        f"(chmod u+r {label}) or run localfab as a user who may read it"
    )


def not_gguf(label: str, start: bytes | int) -> ModelError:
    """The one error for a file that is not GGUF, whoever reads it (the engine, the header parser).

    `start`: the file's first bytes, or its length when only that is known; fewer than four
    bytes are reported as a file too short to be a model.
    """
    n = start if isinstance(start, int) else len(start)
    if isinstance(start, bytes) and n >= len(GGUF_MAGIC):
        found = f"it starts with {start[: len(GGUF_MAGIC)]!r}, not {GGUF_MAGIC!r}"
    else:
        found = f"it is only {n} byte{'' if n == 1 else 's'} long"
    return ModelError(
        f"{label} is not a GGUF file ({found}): give the path of a GGUF model, "
        f"e.g. a *Q4_K_M.gguf file from Hugging Face"
    )


_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_model_file(path: Path) -> None:
    """Raise `ModelError` saying exactly why `path` cannot be read as a model file.

    Missing, a folder, not a regular file (a FIFO or a symlink to a device would block or never
    end), or not readable: each gets its own message, because each has a different fix.
    """
    try:
        st = path.stat()  # follows symlinks: a link to a device is judged by the device
    except PermissionError:
        raise permission_denied(str(path)) from None
    except FileNotFoundError:
        if path.is_symlink():
            raise ModelError(
                f"{path} is a symbolic link to {os.readlink(path)}, which does not exist: "
                f"fix the link or give the path of a .gguf file"
            ) from None
        raise ModelError(f"{path} does not exist: give the path of a .gguf file") from None
    except NotADirectoryError:
        raise ModelError(f"{path} does not exist: give the path of a .gguf file") from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot look at it ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ModelError(f"{path} is a folder, not a file: give the path of a .gguf file")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "a special file")
        raise ModelError(
            f"{path} is not a regular file (it is {kind}): give the path of a .gguf file"
        )
    try:
        with path.open("rb"):
            pass
    except PermissionError:
        raise permission_denied(str(path)) from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot open it ({exc.strerror or exc})") from None


def check_gguf_file(path: Path) -> None:
    """`check_model_file`, then the GGUF magic: fail early on files llama.cpp would reject
    with a log dump."""
    check_model_file(path)
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    if magic != GGUF_MAGIC:
        raise not_gguf(str(path), magic)
