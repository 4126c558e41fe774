"""Bugs found in review of the hub code, each pinned by a test that failed before its fix:
offline mode held by remote header reads, file choice naming the hub it asked, and range
sources told their size through their own API."""

from __future__ import annotations

import ast
from pathlib import Path

import huggingface_hub  # noqa: F401 - the library reads HF_HUB_OFFLINE once, on import
import pytest

from localfab.errors import HubError
from localfab.hub import HttpRangeSource, Hub, HubConfig, ModelRef, open_remote
from localfab.hub.files import RemoteFile, pick_files
from localfab.store import Store
from tests.hf_server import FakeHub

REPO = "owner/Tiny-GGUF"
FILE = "Tiny-Q4_K_M.gguf"
HUB_DIR = Path(__file__).resolve().parents[2] / "localfab" / "hub"


# open_remote and offline mode ------------------------------------------------------------------
def test_open_remote_of_another_host_stays_offline(
    env: Path, other: FakeHub, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    other.add_file(REPO, FILE, data=tiny)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="offline mode is on"):
        open_remote(f"{other.url}/{REPO}")
    with pytest.raises(HubError, match="offline mode is on"):
        Hub(HubConfig(endpoint="https://hub.example", offline=True)).open_remote(
            f"{other.url}/{REPO}"
        )
    assert other.requests == []


def test_range_reads_refuse_the_network_when_offline(
    env: Path, fake: FakeHub, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    offline = HubConfig(endpoint=fake.url, offline=True)
    with pytest.raises(HubError, match="offline mode is on"):
        HttpRangeSource(REPO, FILE, config=offline).read(0, 4)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="offline mode is on"):
        HttpRangeSource(REPO, FILE).read(0, 4)
    assert fake.requests == []


def test_a_remote_model_opened_online_reads_its_header(
    env: Path, fake: FakeHub, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    remote = Hub(HubConfig.from_env()).open_remote(REPO)
    assert remote.sources[0].read(0, 4) == b"GGUF"


# file choice names the hub it asked ------------------------------------------------------------
def test_pick_files_names_the_configured_hub_in_its_refusals() -> None:
    mirror = HubConfig(endpoint="https://mirror.example")
    listing = [RemoteFile(f"Tiny-{q}.gguf", 10, None) for q in ("Q4_K_M", "Q8_0")]
    with pytest.raises(HubError, match=r"quants there: Q4_K_M, Q8_0.*mirror\.example/owner/Tiny"):
        pick_files(ModelRef(repo=REPO, quant="Q2_K"), listing, mirror)
    split = ModelRef(repo=REPO, file="Big-Q4_K_M-00001-of-00002.gguf", revision="v2")
    with pytest.raises(HubError, match=r"not in owner/Tiny-GGUF.*mirror\.example/.*/tree/v2"):
        pick_files(split, listing, mirror)


def test_pull_of_a_missing_quant_points_at_the_mirror_it_listed(
    env: Path, fake: FakeHub, tiny: bytes, tmp_path: Path
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    with pytest.raises(HubError) as err:
        Hub(HubConfig.from_env()).pull(f"{REPO}:Q2_K", store=Store())
    assert f"{fake.url}/{REPO}/tree/main" in str(err.value)


# the known size of a range source --------------------------------------------------------------
def test_a_range_source_told_its_size_needs_no_head(env: Path, fake: FakeHub, tiny: bytes) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    source = HttpRangeSource(REPO, FILE, size=len(tiny))
    assert source.size() == len(tiny)
    assert source.read(len(tiny), 10) == b""
    assert fake.requests == [] and source.requests == 0


def test_open_remote_hands_the_listed_size_to_its_sources(
    env: Path, fake: FakeHub, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    remote = Hub(HubConfig.from_env()).open_remote(REPO)
    heads = [r for r in fake.requests if r.method == "HEAD"]
    assert remote.sources[0].size() == len(tiny)
    assert [r for r in fake.requests if r.method == "HEAD"] == heads


def test_no_hub_module_writes_another_objects_private_attributes() -> None:
    for path in HUB_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr.startswith("_")
                    and not (isinstance(target.value, ast.Name) and target.value.id == "self")
                ):
                    raise AssertionError(f"{path.name}:{node.lineno} writes .{target.attr}")
