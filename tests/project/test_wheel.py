"""An installed localfab works without its source tree: the catalog and the themes ship with it.

The slow tests build the wheel and install it (and, separately, an editable install) into a
fresh virtual environment. Dependencies are not reinstalled there: a `.pth` file lets the new
environment see this environment's site-packages, where they already are. Only the `localfab`
package itself comes from the new install; every command runs from a temporary folder, so the
source checkout is never importable by accident.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localfab.resources import builtin_theme_files, catalog_file
from localfab.store.catalog import load_catalog
from tests.hf_server import FakeHub
from tests.store.test_store import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# What a build needs from the checkout (everything else is tests, scripts and caches).
SOURCES = ("pyproject.toml", "README.md", "localfab", "models", "themes")
SMALLEST = "qwen2.5:0.5b"  # a catalog entry the fake hub serves in the plan check


@dataclass(frozen=True)
class Venv:
    root: Path
    python: Path
    localfab: Path
    site: Path
    cwd: Path  # a folder outside the checkout to run commands from


def _run(
    args: list[str | Path],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _clean_env(venv: Venv, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        VIRTUAL_ENV=str(venv.root),
        PATH=f"{venv.root / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PYTHONDONTWRITEBYTECODE="1",
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    env.update(extra)
    return env


def _copy_sources(target: Path) -> Path:
    """The files a build reads, copied so builds write nothing into the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    target.mkdir(parents=True)
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore)
        else:
            shutil.copy2(source, target / name)
    return target


def _fresh_venv(root: Path, cwd: Path) -> Venv:
    """A new environment without system site-packages that sees this one's dependencies."""
    _run([sys.executable, "-m", "venv", "--without-pip", root], cwd=cwd, timeout=120)
    python = root / "bin" / "python"
    site = Path(
        _run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            cwd=cwd,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        ).stdout.strip()
    )
    # Appended after the new site-packages, so the new install of localfab comes first; .pth
    # files inside the added folder (such as this checkout's editable hook) are not processed.
    (site / "project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return Venv(root=root, python=python, localfab=root / "bin" / "localfab", site=site, cwd=cwd)


def _where(venv: Venv, expr: str) -> Path:
    code = f"import localfab, localfab.resources as r; print({expr})"
    return Path(_run([venv.python, "-c", code], cwd=venv.cwd, env=_clean_env(venv)).stdout.strip())


def _check_catalog_and_themes(venv: Venv) -> None:
    env = _clean_env(venv, LOCALFAB_HOME=str(venv.cwd / "home"))
    listed = _run([venv.localfab, "list", "--catalog", "--json"], cwd=venv.cwd, env=env)
    names = {item["name"] for item in json.loads(listed.stdout)}
    assert {"qwen2.5:7b", "llama3.2:3b", SMALLEST} <= names
    assert len(names) == len(load_catalog())

    code = (
        "from localfab.resources import builtin_theme_files\n"
        "for f in builtin_theme_files():\n"
        "    print(f, len(f.read_text(encoding='utf-8')))\n"
    )
    out = _run([venv.python, "-c", code], cwd=venv.cwd, env=env).stdout.splitlines()
    shipped = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in out}
    assert len(shipped) >= 3 and all(size > 0 for size in shipped.values())
    assert {Path(f).name for f in shipped} == {f.name for f in builtin_theme_files()}
    assert {Path(f).name for f in shipped} == {p.name for p in (ROOT / "themes").glob("*.toml")}


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    """localfab built as a wheel and installed (no -e) into a fresh environment."""
    base = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(base / "src")
    cwd = base / "elsewhere"
    cwd.mkdir()
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-w", base / "dist", src],
        cwd=cwd,
    )
    (wheel,) = (base / "dist").glob("localfab-*.whl")
    venv = _fresh_venv(base / "venv", cwd)
    _run(
        [venv.python, "-m", "pip", "install", "--no-deps", "--no-index", wheel],
        cwd=cwd,
        env=_clean_env(venv),
    )
    yield venv


@pytest.mark.slow
def test_the_wheel_carries_the_catalog_and_the_themes(wheel_venv: Venv) -> None:
    (wheel,) = (wheel_venv.root.parent / "dist").glob("localfab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "localfab/_catalog/catalog.toml" in names
    data = {
        "localfab/py.typed",
        "localfab/data/profiles.json",
        "localfab/data/models.json",
        "localfab/tui/localfab.tcss",  # the terminal app's styles
    }
    assert data <= names
    themes = {n for n in names if n.startswith("localfab/_themes/") and n.endswith(".toml")}
    assert len(themes) >= 3


@pytest.mark.slow
def test_installed_wheel_lists_the_catalog_and_loads_the_themes(wheel_venv: Venv) -> None:
    assert _where(wheel_venv, "localfab.__file__").is_relative_to(wheel_venv.site)
    assert _where(wheel_venv, "r.catalog_file()").is_relative_to(wheel_venv.site)
    _check_catalog_and_themes(wheel_venv)


@pytest.mark.slow
def test_installed_wheel_plans_a_catalog_name_before_download(wheel_venv: Venv) -> None:
    entry = load_catalog().get(SMALLEST)
    assert entry is not None
    tiny = write_tiny_gguf(wheel_venv.cwd / "served" / entry.files[0], arch="qwen2")
    env = _clean_env(
        wheel_venv,
        LOCALFAB_HOME=str(wheel_venv.cwd / "plan-home"),
        HF_HOME=str(wheel_venv.cwd / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
    )
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(var, None)
    with FakeHub() as fake:
        fake.add_file(entry.repo, entry.files[0], disk=tiny)
        env["HF_ENDPOINT"] = fake.url
        proc = _run(
            [wheel_venv.localfab, "plan", SMALLEST, "--profile", "cpu-only-16gb", "--json"],
            cwd=wheel_venv.cwd,
            env=env,
        )
        asked = [r.path for r in fake.requests]
    data = json.loads(proc.stdout)
    assert data["arch"] == "qwen2" and data["header_bytes_fetched"] > 0
    assert any(entry.repo in path for path in asked)  # the catalog name led to its repo
    assert not list((wheel_venv.cwd / "plan-home").rglob("*.gguf"))  # nothing was downloaded


@pytest.mark.slow
def test_editable_install_reads_the_catalog_and_themes_in_place(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.mktemp("editable")
    src = _copy_sources(base / "src")
    cwd = base / "elsewhere"
    cwd.mkdir()
    venv = _fresh_venv(base / "venv", cwd)
    _run(
        [venv.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-e", src],
        cwd=cwd,
        env=_clean_env(venv),
    )
    assert _where(venv, "localfab.__file__").is_relative_to(src / "localfab")
    assert _where(venv, "r.catalog_file()") == src / "models" / "catalog.toml"
    _check_catalog_and_themes(venv)


def test_pyproject_lists_every_package() -> None:
    """The package list is explicit (for the mapped data folders): new subpackages go in it."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    folders = [ROOT / "localfab", *(ROOT / "localfab").rglob("*")]
    on_disk = {
        ".".join(folder.relative_to(ROOT).parts)
        for folder in folders
        if folder.is_dir() and folder.name != "__pycache__"
    }
    assert set(setuptools["packages"]) == on_disk | set(setuptools["package-dir"])


def test_this_install_reads_the_catalog_and_themes_as_package_data() -> None:
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert Path(str(catalog_file())).parent == ROOT / mapped["localfab._catalog"]
    themes = builtin_theme_files()
    assert len(themes) >= 3
    assert {Path(str(f)).parent for f in themes} == {ROOT / mapped["localfab._themes"]}


def test_missing_themes_leave_an_empty_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from localfab import resources

    monkeypatch.setattr(resources, "THEMES_PACKAGE", "localfab._no_such_data")
    assert resources.builtin_theme_files() == []
