"""Models the store knows without a registry entry: the embedded models (localfab.store.embedded).

A virtual entry is listed, found by name and removable like a registered download, and its name
cannot be registered by anything else. Its file is written out on first use (`materialise`).
"""

from __future__ import annotations

from pathlib import Path

from localfab.config import Paths
from localfab.errors import ModelNotFound
from localfab.store.embedded import EMBEDDED, EmbeddedModel, embedded_by_name, embedded_model_path
from localfab.store.entry import ModelEntry


def virtual_entries(paths: Paths) -> list[ModelEntry]:
    """The virtual entries this installation has (each embedded model whose package it has)."""
    return [_entry(model, paths) for model in EMBEDDED if model.available()]


def _entry(model: EmbeddedModel, paths: Paths) -> ModelEntry:
    path = model.target(paths)
    present = path.is_file()
    return ModelEntry(
        name=model.name,
        path=path,
        files=(path,),
        size=path.stat().st_size if present else None,
        quant=model.quant,
        arch=model.arch,
        source="embedded",
        present=present,
    )


def is_virtual_name(name: str) -> bool:
    """Whether `name` belongs to a virtual entry (installed or not): it cannot be registered."""
    return embedded_by_name(name) is not None


def materialise(entry: ModelEntry, paths: Paths) -> Path:
    """The file of a virtual entry, written out on first use."""
    path = embedded_model_path(paths, entry.name)
    if path is None:
        raise ModelNotFound(_not_installed(entry.name))
    return path


def missing_virtual(name: str) -> str | None:
    """Why a virtual `name` is unavailable (its package is not installed), or None."""
    model = embedded_by_name(name)
    if model is not None and not model.available():
        return _not_installed(name)
    return None


def _not_installed(name: str) -> str:
    model = embedded_by_name(name)
    assert model is not None
    return (
        f"{model.name} is {model.about}, but its package ({model.distribution}) is not "
        f"installed: pip install 'localfab[model]'"
    )
