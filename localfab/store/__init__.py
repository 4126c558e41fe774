"""The local model store: which GGUF models this machine has, under which names.

Downloads live under `Paths.models_dir`, one folder per Hugging Face repo; models added by path
stay where they are. The index is one JSON file (`Paths.registry_file`) changed only through
`Registry.update()`: read, checked, changed and rewritten atomically under a lock. A model is
registered only once all its files are complete and verified, so a partial or failed download
never shows up as a model.

Modules: `naming` (names and paths the store trusts), `entry` (`ModelEntry`), `registry` (the
file and its lock), `resolve` (from what the user typed to a file, with suggestions), `virtual`
(the embedded test model as an entry with no registration), `files` (split parts, leftovers,
free space) and `core` (`Store`).
"""

from __future__ import annotations

from localfab.store.core import Store
from localfab.store.entry import SOURCES, ModelEntry, RemovedModel, Source
from localfab.store.files import PARTIAL_DIR, disk_free
from localfab.store.naming import (
    default_name,
    gguf_summary,
    has_control_chars,
    is_valid_name,
    printable,
    quant_from_name,
    safe_file_name,
    safe_repo_dir,
    validate_name,
)
from localfab.store.registry import REGISTRY_VERSION, Registry

__all__ = [
    "PARTIAL_DIR",
    "REGISTRY_VERSION",
    "SOURCES",
    "ModelEntry",
    "Registry",
    "RemovedModel",
    "Source",
    "Store",
    "default_name",
    "disk_free",
    "gguf_summary",
    "has_control_chars",
    "is_valid_name",
    "printable",
    "quant_from_name",
    "safe_file_name",
    "safe_repo_dir",
    "validate_name",
]
