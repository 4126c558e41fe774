"""Data shipped inside the package: the model catalog and the built-in themes.

Their source stays at the top of the repository (`models/`, `themes/`); pyproject.toml maps those
folders into the package as `localfab._catalog` and `localfab._themes`, so a wheel carries them
and an editable install reads them in place. They are read through `importlib.resources` only,
never by a path relative to this file, which would hold in a source checkout alone.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

from localfab.errors import LocalfabError

CATALOG_PACKAGE = "localfab._catalog"
CATALOG_FILE = "catalog.toml"
CATALOG_FACTS_FILE = "catalog_facts.json"
THEMES_PACKAGE = "localfab._themes"

_REINSTALL = "reinstall localfab (`pip install .`, or `pip install -e .` in a source checkout)"


class PackageDataError(LocalfabError):
    """Data that should ship with localfab is missing: an incomplete or outdated install."""


def _package(name: str) -> Traversable:
    try:
        return resources.files(name)
    except ModuleNotFoundError as exc:
        raise PackageDataError(
            f"localfab's package data {name} is not installed: {_REINSTALL}"
        ) from exc


def catalog_file() -> Traversable:
    """The shipped model catalog (`models/catalog.toml` in the repository)."""
    file = _package(CATALOG_PACKAGE) / CATALOG_FILE
    if not file.is_file():
        raise PackageDataError(f"the model catalog {file} is missing: {_REINSTALL}")
    return file


def catalog_text() -> str:
    """The shipped model catalog's TOML text; `PackageDataError` if it is not installed."""
    file = catalog_file()
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PackageDataError(
            f"the model catalog {file} cannot be read ({exc}): {_REINSTALL}"
        ) from exc


def catalog_facts_text() -> str | None:
    """The catalog's header facts (`models/catalog_facts.json`), or None when not installed:
    fits before download then need the network, as before."""
    try:
        file = _package(CATALOG_PACKAGE) / CATALOG_FACTS_FILE
        return file.read_text(encoding="utf-8") if file.is_file() else None
    except (PackageDataError, OSError):
        return None


def builtin_theme_files() -> list[Traversable]:
    """The shipped theme files (`themes/*.toml` in the repository), sorted by name.

    Empty when the themes are not installed, so the interface still starts on Textual's own
    themes instead of failing.
    """
    try:
        folder = _package(THEMES_PACKAGE)
        return sorted(
            (f for f in folder.iterdir() if f.name.endswith(".toml") and f.is_file()),
            key=lambda f: f.name,
        )
    except (PackageDataError, OSError):
        return []
