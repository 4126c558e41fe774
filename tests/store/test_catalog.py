"""The curated catalog parses, every entry is complete, and broken catalogs are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab import resources
from localfab.store import quant_from_name
from localfab.store.catalog import CatalogError, load_catalog


def test_catalog_has_at_least_twelve_complete_entries() -> None:
    catalog = load_catalog()
    assert len(catalog) >= 12
    for entry in catalog:
        assert entry.title and entry.note and entry.license and entry.params
        assert entry.repo.count("/") == 1
        assert entry.files and all(f.endswith(".gguf") for f in entry.files)
        assert entry.quant == "Q4_K_M"
        assert all(quant_from_name(f) == "Q4_K_M" for f in entry.files)
        assert entry.context_length >= 2048
        # 0.5B to 14B at Q4_K_M: roughly 0.3 GB to 10 GB.
        assert 300_000_000 < entry.size_bytes < 10_000_000_000


def test_catalog_names_are_unique_and_found_case_insensitively() -> None:
    catalog = load_catalog()
    names = [n.casefold() for e in catalog for n in e.names]
    assert len(names) == len(set(names))
    assert catalog.get("QWEN2.5:7B") is catalog.get("qwen2.5:7b")
    entry = catalog.get("llama3.2:3b")
    assert entry is not None
    assert entry.repo == "bartowski/Llama-3.2-3B-Instruct-GGUF"
    assert entry.files == ("Llama-3.2-3B-Instruct-Q4_K_M.gguf",)
    assert catalog.get("no-such-model") is None


def test_catalog_spans_small_to_fourteen_billion() -> None:
    sizes = sorted(e.size_bytes for e in load_catalog())
    assert sizes[0] < 500_000_000  # a 0.5B model for any CPU
    assert sizes[-1] > 8_000_000_000  # a 14B model for a card plus RAM


GOOD = """
[[model]]
name = "x:1b"
title = "X"
repo = "o/X-GGUF"
files = ["X-Q4_K_M.gguf"]
quant = "Q4_K_M"
size_bytes = 1000
params = "1B"
license = "mit"
context_length = 4096
note = "n"
"""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('note = "n"\n', ""), "missing field 'note'"),
        (('files = ["X-Q4_K_M.gguf"]', 'files = ["../X-Q4_K_M.gguf"]'), "not a plain .gguf"),
        (('repo = "o/X-GGUF"', 'repo = "../X"'), "'../X' is not a Hugging Face repo id: expected"),
        (('name = "x:1b"', 'name = "../x"'), "not a valid model name"),
        (("size_bytes = 1000", 'size_bytes = "big"'), "must be a int"),
        (('files = ["X-Q4_K_M.gguf"]', 'files = ["X-Q8_0.gguf"]'), "does not carry the quant"),
    ],
)
def test_broken_entries_are_refused_with_the_field_named(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(GOOD + GOOD.replace('repo = "o/X-GGUF"', 'repo = "o/Y-GGUF"'))
    with pytest.raises(CatalogError, match="used by both"):
        load_catalog(path)


def test_the_shipped_catalog_is_package_data() -> None:
    catalog = load_catalog()
    assert catalog.path is None  # read through importlib.resources, not a path beside the code
    assert catalog.get("qwen2.5:7b") is not None


def test_a_missing_shipped_catalog_says_to_reinstall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resources, "CATALOG_PACKAGE", "localfab._no_such_data")
    with pytest.raises(CatalogError, match=r"not installed: reinstall localfab .*localfab pull"):
        load_catalog()
