"""`pull` fetches a vision model's projector with it, as llama-server's `-hf` picks one (the
mmproj closest to the model's quant, in its folder or above), registers it beside the model;
`list` and `show` say "vision", `rm` deletes it too, `--no-mmproj` leaves it."""

from __future__ import annotations

import json
from pathlib import Path

from localfab.hub import Hub, HubConfig
from localfab.hub.files import RemoteFile, pick_projector
from localfab.runtime import find_projector
from localfab.store import Store
from tests.hf_server import FakeHub
from tests.hub.test_download import cli_env, lf

REPO = "owner/Seeing-GGUF"
MODEL = "Seeing-Q4_K_M.gguf"


def listing(*paths: str) -> list[RemoteFile]:
    return [RemoteFile(p, 1, None) for p in paths]


def test_the_projector_is_picked_as_llama_server_picks_it() -> None:
    files = listing(MODEL, "mmproj-F16.gguf", "mmproj-Q8_0.gguf", "mmproj-F32.gguf", "README.md")
    assert pick_projector(MODEL, files) == files[2]  # 8 bits are closest to 4
    deep = listing(
        "Q4/Seeing-Q4_K_M.gguf", "mmproj-f16.gguf", "Q4/mmproj-f16.gguf", "x/mmproj.gguf"
    )
    assert pick_projector(deep[0].path, deep) == deep[2]  # its own folder first, never a sibling's
    assert pick_projector(MODEL, listing(MODEL, "Seeing-Q8_0.gguf")) is None


def add_repo(fake: FakeHub, tiny: bytes) -> None:
    fake.add_file(REPO, MODEL, data=tiny)
    fake.add_file(REPO, "mmproj-Seeing-f16.gguf", data=tiny + b"f16")
    fake.add_file(REPO, "mmproj-Seeing-Q8_0.gguf", data=tiny + b"q8")


def test_pull_fetches_the_projector_and_rm_deletes_it(
    env: Path,
    fake: FakeHub,
    store: Store,
    tiny: bytes,
) -> None:
    add_repo(fake, tiny)
    hub = Hub(HubConfig.from_env())
    result = hub.pull(f"{REPO}:Q4_K_M", store=store)
    entry = result.entry
    assert entry.projector is not None and entry.projector.name == "mmproj-Seeing-Q8_0.gguf"
    assert entry.projector.read_bytes() == tiny + b"q8" and entry.vision
    assert entry.projector.parent == entry.path.parent and entry.files == (entry.path,)
    assert store.get(entry.name).projector == entry.projector  # type: ignore[union-attr]
    assert find_projector(entry.path) is None  # the tiny stand-ins are no real projector
    removed = store.remove(entry.name)
    assert entry.projector in removed.deleted and not entry.projector.exists()
    plain = hub.pull(f"{REPO}:Q4_K_M", store=store, projector=False).entry
    assert plain.projector is None and not (plain.path.parent / "mmproj-Seeing-Q8_0.gguf").exists()


def test_cli_pull_list_and_show_say_vision(fake: FakeHub, tmp_path: Path, tiny: bytes) -> None:
    add_repo(fake, tiny)
    environ = cli_env(fake, tmp_path)
    done = lf(environ, "pull", f"{REPO}:Q4_K_M", "-q")
    assert done.returncode == 0, done.stderr
    assert "reads images: its vision projector mmproj-Seeing-Q8_0.gguf came with it" in done.stdout
    listed = [m for m in json.loads(lf(environ, "list", "--json", "--no-fit").stdout) if m["repo"]]
    assert listed[0]["vision"] is True and listed[0]["projector"].endswith(
        "mmproj-Seeing-Q8_0.gguf"
    )
    assert " vision" in lf(environ, "list", "--no-fit").stdout
    assert "reads images: projector" in lf(environ, "show", listed[0]["name"]).stdout
    catalog = json.loads(lf(environ, "list", "--catalog", "--json").stdout)
    assert {c["name"] for c in catalog if c["vision"]} >= {"gemma3:4b"}


def test_a_catalog_vision_model_comes_with_its_projector(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    repo = "bartowski/google_gemma-3-4b-it-GGUF"
    fake.add_file(repo, "google_gemma-3-4b-it-Q4_K_M.gguf", data=tiny)
    fake.add_file(repo, "mmproj-google_gemma-3-4b-it-f16.gguf", data=tiny + b"f16")
    entry = Hub(HubConfig.from_env()).pull("gemma3:4b", store=store).entry
    assert entry.projector is not None and entry.projector.name.startswith("mmproj-google")
    # Already here, projector and all: a second pull fetches nothing.
    again = Hub(HubConfig.from_env()).pull("gemma3:4b", store=store)
    assert again.already_present and again.entry.projector == entry.projector
