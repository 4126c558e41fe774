"""A registry that is damaged, newer or cannot be written: no tracebacks, nothing lost."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from localfab.config import Paths, default_paths
from localfab.errors import LocalfabError, ModelError
from localfab.store import Store
from tests.conftest import LOCALFAB
from tests.store.test_store import write_tiny_gguf

BAD_ENTRIES = {
    "a-string": "not an object",
    "no-path": {"size": 5, "source": "local"},
    "int-path": {"path": 42, "source": "local"},
    "str-size": {"path": "/tmp/x.gguf", "size": "big", "source": "local"},
    "files-int": {"path": "/tmp/x.gguf", "files": 7},
    "odd-source": {"path": "/tmp/x.gguf", "source": 3},
    "escape-arch": {"path": "/tmp/x.gguf", "arch": "\x1b]0;pwned\x07"},
}


@pytest.fixture()
def paths(tmp_path: Path) -> Paths:
    return default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})


@pytest.fixture()
def store(paths: Paths) -> Store:
    return Store(paths)


@pytest.fixture()
def damaged(store: Store, paths: Paths, tmp_path: Path) -> Path:
    """A registry with one good entry ("good") and every kind of bad one; returns the model."""
    model = write_tiny_gguf(tmp_path / "models" / "good.gguf")
    store.add(model, name="good")
    data = json.loads(paths.registry_file.read_text())
    data["models"].update(BAD_ENTRIES)
    paths.registry_file.write_text(json.dumps(data))
    return model


def lf(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )


def assert_clean(proc: subprocess.CompletedProcess[str], code: int) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr


# damaged entries -------------------------------------------------------------------------------
def test_damaged_entries_are_skipped_with_a_warning(
    store: Store, damaged: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = [e.name for e in store.list() if e.source != "embedded"]
    assert names == ["good"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    for name in BAD_ENTRIES:
        assert repr(name) in warned
    assert "localfab rm" in warned
    assert store.get("good") is not None and store.get("a-string") is None
    assert store.resolve("good") == damaged.resolve()
    assert store.find(repo="x/y", files=["a.gguf"]) is None


def test_resolving_a_damaged_entry_says_how_to_remove_it(store: Store, damaged: Path) -> None:
    for name in BAD_ENTRIES:
        with pytest.raises(ModelError, match=rf"'{name}' is damaged.*localfab rm {name}"):
            store.resolve(name)


def test_damaged_entries_can_be_removed(store: Store, damaged: Path, paths: Paths) -> None:
    for name in BAD_ENTRIES:
        assert store.damaged(name) == name
        removed = store.remove(name)
        assert removed.name == name and removed.deleted == ()
    assert list(json.loads(paths.registry_file.read_text())["models"]) == ["good"]
    assert damaged.is_file()


def test_a_new_model_can_take_a_damaged_entrys_name(
    store: Store, damaged: Path, tmp_path: Path
) -> None:
    entry = store.add(write_tiny_gguf(tmp_path / "new.gguf"), name="str-size")
    assert store.get("str-size") == entry


def test_touch_ignores_damaged_entries_and_registries(store: Store, damaged: Path) -> None:
    store.touch("a-string")  # no crash, nothing changed
    store.touch("good")
    good = store.get("good")
    assert good is not None and good.last_used is not None
    store.paths.registry_file.write_text("{ not json")
    store.touch("good")


def test_cli_list_show_run_rm_with_damaged_entries(
    damaged: Path, lf_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(lf_env, LOCALFAB_HOME=str(tmp_path / "home"))
    listed = lf(env, "list", "--no-fit")
    assert_clean(listed, 0)
    assert "good" in listed.stdout and "a-string" not in listed.stdout
    assert "damaged registry entry 'int-path'" in listed.stderr

    assert_clean(lf(env, "show", "good"), 0)
    shown = lf(env, "show", "str-size")
    assert_clean(shown, 3)
    assert "localfab rm str-size" in shown.stderr

    ran = lf(env, "run", "no-path", "Hi", "-n", "2")
    assert_clean(ran, 3)
    assert "damaged" in ran.stderr

    asked = lf(env, "rm", "int-path", stdin="y\n")
    assert_clean(asked, 0)
    assert "forgot the damaged entry 'int-path'" in asked.stdout
    for name in ("a-string", "no-path", "str-size"):
        assert_clean(lf(env, "rm", name, "-y"), 0)
    listed = lf(env, "list", "--no-fit")
    assert "int-path" not in listed.stderr and "a-string" not in listed.stderr


# registries this version must not touch --------------------------------------------------------
def test_a_newer_registry_is_refused_and_left_alone(
    store: Store, paths: Paths, tmp_path: Path
) -> None:
    paths.registry_file.parent.mkdir(parents=True)
    text = json.dumps({"version": 2, "models": {"future": {"path": 1, "shape": "new"}}})
    paths.registry_file.write_text(text)
    with pytest.raises(LocalfabError, match="version 2, written by a newer localfab.*upgrade"):
        store.list()
    with pytest.raises(LocalfabError, match="newer"):
        store.add(write_tiny_gguf(tmp_path / "m.gguf"))
    with pytest.raises(LocalfabError, match="newer"):
        store.remove("future")
    assert paths.registry_file.read_text() == text


@pytest.mark.parametrize(
    "text",
    ["{ not json", "[1, 2]", '{"version": "one", "models": {}}', '{"models": []}', "\udcff"],
)
def test_a_damaged_registry_is_one_clear_error(store: Store, paths: Paths, text: str) -> None:
    paths.registry_file.parent.mkdir(parents=True)
    paths.registry_file.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(LocalfabError, match="registry"):
        store.list()


# writes that fail ------------------------------------------------------------------------------
def test_disk_full_during_a_registry_write_keeps_the_old_registry(
    store: Store, paths: Paths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add(write_tiny_gguf(tmp_path / "a.gguf"), name="a")
    before = paths.registry_file.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("localfab.store.registry.os.fsync", full)
    with pytest.raises(LocalfabError, match="No space left on device.*free some disk space"):
        store.add(write_tiny_gguf(tmp_path / "b.gguf"), name="b")
    assert paths.registry_file.read_bytes() == before
    assert [p.name for p in paths.registry_file.parent.iterdir() if p.suffix == ".tmp"] == []


def test_disk_full_reaches_the_cli_as_one_line(lf_env: dict[str, str], tmp_path: Path) -> None:
    """ENOSPC in the middle of `localfab add`, injected through a sitecustomize module."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import errno, os\n"
        "def _full(fd):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "os.fsync = _full\n"
    )
    env = dict(lf_env, PYTHONPATH=f"{hook}:{lf_env.get('PYTHONPATH', '')}".rstrip(":"))
    proc = lf(env, "add", str(write_tiny_gguf(tmp_path / "m.gguf")))
    assert_clean(proc, 1)
    assert proc.stderr.startswith("localfab: error: could not update the model registry")
    assert "No space left on device" in proc.stderr


# `run PATH` needs no registry ------------------------------------------------------------------
@pytest.mark.model
def test_run_a_path_with_a_corrupt_registry(
    model_path: Path, lf_env: dict[str, str], tmp_path: Path
) -> None:
    registry = default_paths(lf_env).registry_file
    registry.parent.mkdir(parents=True)
    registry.write_text("{ this is not json")
    proc = lf(lf_env, "run", str(model_path), "Hello", "-n", "2", "--raw")
    assert_clean(proc, 0)
    assert registry.read_text() == "{ this is not json"
