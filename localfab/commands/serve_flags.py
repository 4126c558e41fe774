"""`localfab serve`'s options that name a folder, a size or a JSON object, checked and
converted (each error one line naming the flag)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localfab.errors import UsageError
from localfab.units import MiB


def slot_folder(path: Path | None) -> Path | None:
    """The folder of `--slot-save-path`, which must exist (as llama-server)."""
    if path is not None and not path.is_dir():
        raise UsageError(f"--slot-save-path {path} is not a folder: create it first")
    return path


def template_kwargs(text: str | None) -> tuple[tuple[str, Any], ...]:
    """--chat-template-kwargs: a JSON object of the template's variables."""
    if not text:
        return ()
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--chat-template-kwargs is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise UsageError(
            '--chat-template-kwargs must be a JSON object, e.g. {"enable_thinking": false}'
        )
    return tuple(value.items())


def cache_disk(mib: int) -> tuple[Path, int] | None:
    """The disk tier's folder and bytes for `--cache-disk MIB`; None when off."""
    if mib < 0:
        raise UsageError(f"--cache-disk must be 0 (off) or a size in MiB, not {mib}")
    if mib == 0:
        return None
    from localfab.config import default_paths

    return default_paths().prompt_cache_dir, mib * MiB


def cache_ram_limit(mib: int | None, planned: int | None = None) -> int | None:
    """Bytes the prompt cache may hold for `--cache-ram MIB` (None: no limit); without the
    flag, what the plan counted for it (`planned`: half the RAM its load leaves free, at most
    llama-server's 8 GiB), or without a plan that share of the RAM free now."""
    if mib is not None:
        if mib < -1:
            raise UsageError(
                f"--cache-ram must be -1 (no limit), 0 (off) or a size in MiB, not {mib}"
            )
        return None if mib == -1 else mib * MiB
    if planned is not None:
        return planned
    from localfab.engine.prompt_cache import default_limit

    return default_limit()
