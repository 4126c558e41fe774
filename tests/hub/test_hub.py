"""Hub downloads against a local fake hub (`tests/hf_server.py`) reached through HF_ENDPOINT.

Nothing here touches huggingface.co: every test points HF_ENDPOINT at the fake hub, and the
fake records each request (with its Range header) so the tests can check what was fetched.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from localfab.errors import HubError, UsageError
from localfab.hub import DownloadProgress, HttpRangeSource, Hub, HubConfig, open_remote, parse_ref
from localfab.store import Store
from tests.hf_server import FakeHub
from tests.hub_fixtures import hub

REPO = "owner/Tiny-GGUF"
FILE = "Tiny-Q4_K_M.gguf"
CHUNK = 10 * 1024 * 1024  # huggingface_hub writes downloads in chunks of this size


def registered(store: Store) -> list[str]:
    return [e.name for e in store.list() if e.source != "embedded"]


# full downloads -----------------------------------------------------------------------------------
def test_full_download_via_cdn_redirect_registers_the_model(
    env: Path, store: Store, model_path: Path
) -> None:
    with FakeHub(cdn=True) as fake:
        repo = "owner/gemma-3-270m-it-GGUF"
        fake.add_file(repo, "gemma-3-270m-it-Q4_K_M.gguf", disk=model_path)
        fake.add_file(repo, "gemma-3-270m-it-Q8_0.gguf", data=b"decoy" * 100)
        fake.add_file(repo, "README.md", data=b"# card", lfs=False)
        events: list[DownloadProgress] = []
        h = Hub(HubConfig.from_env(endpoint=fake.url))
        result = h.pull(repo, store=store, progress=events.append)

        entry = result.entry
        assert (entry.quant, entry.arch, entry.source) == ("Q4_K_M", "gemma3", "hub")
        assert entry.name == "gemma-3-270m-it-q4_k_m"
        assert entry.path.read_bytes()[:4] == b"GGUF"
        assert entry.size == model_path.stat().st_size
        assert entry.sha256[0] == fake.repos[repo].files["gemma-3-270m-it-Q4_K_M.gguf"].sha256
        assert result.verified and result.downloaded == entry.size
        assert store.resolve(entry.name) == entry.path
        # The download went to the "CDN" origin, without the decoy, and nothing else was fetched.
        gets = fake.content_gets()
        assert [r.path.startswith("/cdn/") for r in gets] == [True]
        assert fake.bytes_sent() == entry.size
        # Progress ended complete, with a verify stage.
        downloads = [e for e in events if e.stage == "download"]
        assert downloads[-1].done == downloads[-1].total == entry.size
        assert any(e.stage == "verify" for e in events)

        # Pulling again finds it on disk without downloading anything.
        before = len(fake.requests)
        again = h.pull(repo, store=store)
        assert again.already_present and fake.bytes_sent() == entry.size
        assert len(fake.requests) == before


def test_hf_endpoint_is_read_at_call_time(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    result = hub().pull(f"{REPO}:q4_k_m", store=store)  # quant is case-insensitive
    assert result.entry.path.read_bytes() == tiny
    assert any(r.path == f"/api/models/{REPO}/tree/main" for r in fake.requests)


def test_catalog_name_downloads_the_catalog_file(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(
        "bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q4_K_M.gguf", data=tiny
    )
    result = hub().pull("llama3.2:1b", store=store)
    assert result.entry.name == "llama3.2:1b"
    assert store.resolve("llama3.2:1b") == result.entry.path
    # A known file needs no listing: one HEAD, one GET.
    assert [r.method for r in fake.requests] == ["HEAD", "GET"]


# resume -------------------------------------------------------------------------------------------
def test_dropped_connection_resumes_without_refetching(
    env: Path, fake: FakeHub, store: Store, big: bytes
) -> None:
    fake.add_file(REPO, FILE, data=big)
    fake.drop(REPO, FILE, after=CHUNK + CHUNK // 2)
    result = hub().pull(REPO, store=store)

    assert result.entry.path.read_bytes() == big
    first, second = fake.content_gets(FILE)
    assert first.range is None and first.sent == CHUNK + CHUNK // 2
    # The retry asks only for what is not on disk yet (one whole chunk had been written).
    assert second.range == f"bytes={CHUNK}-"
    assert second.sent == len(big) - CHUNK


def test_interrupted_pull_keeps_partial_and_next_pull_resumes(
    env: Path, fake: FakeHub, store: Store, big: bytes
) -> None:
    fake.add_file(REPO, FILE, data=big)
    fake.drop(REPO, FILE, after=CHUNK + 1000)
    fake.error_once(REPO, FILE, 500)  # the in-process retry fails too: the pull gives up
    with pytest.raises(HubError, match=r"HTTP 500.*10\.0 MiB already downloaded are kept"):
        hub().pull(REPO, store=store)
    assert registered(store) == []  # a partial download is never a model
    (partial,) = store.partial_files()
    assert partial.stat().st_size == CHUNK

    result = hub().pull(REPO, store=store)
    assert result.resumed == CHUNK
    assert result.entry.path.read_bytes() == big
    last = fake.content_gets(FILE)[-1]
    assert last.range == f"bytes={CHUNK}-"
    assert last.sent == len(big) - CHUNK
    assert store.partial_files() == []


# verification -------------------------------------------------------------------------------------
def test_checksum_mismatch_discards_the_file(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny).corrupt = True
    with pytest.raises(HubError, match="checksum mismatch.*discarded.*nothing was registered"):
        hub().pull(REPO, store=store)
    assert registered(store) == []
    assert store.partial_files() == []
    assert not store.download_path(REPO, FILE).exists()


# errors -------------------------------------------------------------------------------------------
def test_gated_repo_without_token_says_accept_licence_and_set_token(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    fake.gate(REPO, "hf_good")
    with pytest.raises(HubError) as err:
        hub().pull(REPO, store=store)
    message = str(err.value)
    assert "gated" in message and "401" in message and "HF_TOKEN" in message
    assert f"{fake.url}/{REPO}" in message  # the model page, on the configured endpoint
    assert err.value.exit_code == 5


def test_token_is_sent_when_given(
    env: Path, fake: FakeHub, store: Store, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    fake.gate(REPO, "hf_good")
    result = Hub(HubConfig.from_env(token="hf_good")).pull(REPO, store=store)
    assert result.entry.path.read_bytes() == tiny
    assert {r.authorization for r in fake.requests} == {"Bearer hf_good"}

    # HF_TOKEN works the same way.
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    store.remove(result.entry.name)
    assert hub().pull(REPO, store=store).entry.path.read_bytes() == tiny


def test_gated_repo_with_refused_token_is_403(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    fake.gate(REPO, "hf_good", denied=("hf_not_accepted",))
    with pytest.raises(HubError, match=r"gated.*403.*accept its licence"):
        Hub(HubConfig.from_env(token="hf_not_accepted")).pull(REPO, store=store)


def test_plain_401_and_403(env: Path, fake: FakeHub, store: Store, tiny: bytes) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    fake.fail(REPO, 401)
    with pytest.raises(HubError, match=r"401.*set HF_TOKEN"):
        hub().pull(REPO, store=store)
    fake.fail(REPO, 403)
    with pytest.raises(HubError, match=r"403"):
        hub().pull(f"{REPO}/{FILE}", store=store)


def test_unknown_repo_is_404(env: Path, fake: FakeHub, store: Store) -> None:
    with pytest.raises(HubError, match=r"no repo nobody/Nothing-GGUF.*404"):
        hub().pull("nobody/Nothing-GGUF", store=store)


def test_missing_file_lists_the_q4_k_m_files_that_exist(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    fake.add_file(REPO, "Tiny-Q8_0.gguf", data=tiny)
    with pytest.raises(HubError, match=rf"Wrong-Q4_K_M.gguf is not in {REPO} \(HTTP 404\).*{FILE}"):
        hub().pull(f"https://huggingface.co/{REPO}/resolve/main/Wrong-Q4_K_M.gguf", store=store)
    with pytest.raises(HubError, match=r"no Q2_K \.gguf file; quants there: Q4_K_M, Q8_0"):
        hub().pull(f"{REPO}:Q2_K", store=store)


def test_an_unreachable_hub_fails_at_once_without_the_librarys_retries(
    env: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.utils._http as http

    from localfab.hub import reach

    waits: list[float] = []
    monkeypatch.setattr(http.time, "sleep", waits.append)  # the library's backoff waits
    with FakeHub() as dead:
        url = dead.url  # a port nobody listens on once stopped
    reach.forget()
    with pytest.raises(HubError, match=r"cannot reach .*no connection to 127.0.0.1.*looks offline"):
        Hub(HubConfig.from_env(endpoint=url)).pull(f"{REPO}/{FILE}", store=store)
    with pytest.raises(HubError, match=r"the name hub\.invalid does not resolve.*looks offline"):
        Hub(HubConfig.from_env(endpoint="http://hub.invalid")).list_files(REPO)
    assert waits == []  # no request was sent, so nothing was retried


def test_a_network_failure_past_the_first_look_says_retry(
    env: Path, store: Store, fake: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub answered the first look, then the connection failed: the library retried, and
    the error says to run the command again."""
    import huggingface_hub.utils._http as http

    from localfab.hub import reach

    monkeypatch.setattr(http.time, "sleep", lambda s: None)  # skip the library's backoff waits
    reach.forget()
    url = fake.url
    reach.check_reachable(url)  # reachable: kept for a minute
    fake.stop()
    with pytest.raises(HubError, match=r"network failure.*run the same command again"):
        Hub(HubConfig.from_env(endpoint=url)).pull(f"{REPO}/{FILE}", store=store)


def test_disk_space_is_checked_before_downloading(
    env: Path, fake: FakeHub, store: Store, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    monkeypatch.setattr("localfab.hub.download.disk_free", lambda path: 10_000)
    with pytest.raises(HubError, match=r"not enough disk space.*LOCALFAB_HOME"):
        hub().pull(REPO, store=store)
    assert fake.content_gets() == []


def test_offline_mode_refuses_downloads_but_finds_what_is_here(
    env: Path, fake: FakeHub, store: Store, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match="offline"):
        hub().pull(REPO, store=store)
    assert fake.requests == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub().pull(REPO, store=store)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    count = len(fake.requests)
    assert hub().pull(REPO, store=store).already_present
    assert len(fake.requests) == count


# split models and names ---------------------------------------------------------------------------
def test_split_gguf_downloads_every_part(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    parts = [tiny, b"part two" * 1000, b"part three" * 1000]
    for i, data in enumerate(parts, 1):
        fake.add_file(REPO, f"Q4_K_M/Big-Q4_K_M-{i:05d}-of-00003.gguf", data=data)
    fake.add_file(REPO, "Big-Q8_0.gguf", data=b"x" * 10)
    result = hub().pull(REPO, store=store)
    entry = result.entry
    assert [p.name for p in entry.files] == [f"Big-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert [p.read_bytes() for p in entry.files] == parts
    assert entry.path == entry.files[0] and entry.name == "big-q4_k_m"
    assert entry.sha256 == tuple(hashlib.sha256(p).hexdigest() for p in parts)


def test_split_gguf_with_a_missing_part_is_refused(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, "Big-Q4_K_M-00001-of-00002.gguf", data=tiny)
    with pytest.raises(HubError, match=r"part\(s\) 2 are missing"):
        hub().pull(REPO, store=store)


def test_path_traversal_in_a_repo_listing_is_refused(
    env: Path, fake: FakeHub, store: Store, tiny: bytes, tmp_path: Path
) -> None:
    fake.add_file(REPO, "../../../evil-Q4_K_M.gguf", data=tiny)
    with pytest.raises(UsageError, match="refusing repo file name"):
        hub().pull(REPO, store=store)
    assert fake.content_gets() == []
    assert not list(tmp_path.rglob("evil*"))


def test_path_traversal_in_names_is_refused(env: Path, store: Store) -> None:
    with pytest.raises(UsageError):
        hub().pull(f"{REPO}/../../x-Q4_K_M.gguf", store=store)
    with pytest.raises(UsageError):
        hub().pull("../etc:Q4_K_M", store=store)
    with pytest.raises(UsageError, match="not a valid model name"):
        hub().pull(REPO, store=store, name="../../escape")


def test_parse_ref_forms() -> None:
    assert parse_ref("owner/Repo-GGUF").repo == "owner/Repo-GGUF"
    assert parse_ref("owner/Repo-GGUF:q5_k_m").quant == "Q5_K_M"
    url = parse_ref(
        "https://huggingface.co/owner/Repo-GGUF/resolve/main/x-Q4_K_M.gguf?download=true"
    )
    assert (url.repo, url.file, url.revision, url.endpoint) == (
        "owner/Repo-GGUF",
        "x-Q4_K_M.gguf",
        "main",
        None,
    )
    assert parse_ref("hf.co/owner/Repo-GGUF:Q8_0").quant == "Q8_0"
    mirror = parse_ref("https://hf-mirror.example/owner/Repo-GGUF/blob/v1/a/b-Q4_K_M.gguf")
    assert (mirror.endpoint, mirror.revision, mirror.file) == (
        "https://hf-mirror.example",
        "v1",
        "a/b-Q4_K_M.gguf",
    )
    catalog = parse_ref("qwen2.5:7b")
    assert catalog.name == "qwen2.5:7b" and catalog.file == "Qwen2.5-7B-Instruct-Q4_K_M.gguf"
    with pytest.raises(UsageError, match="neither a catalog name"):
        parse_ref("just-a-word")


# fit before download: ranged reads of the header ------------------------------------------------
def test_remote_header_costs_less_than_16_mib(env: Path, model_path: Path) -> None:
    from localfab.gguf.facts import read_facts

    with FakeHub(cdn=True) as fake:
        repo = "owner/gemma-3-270m-it-GGUF"
        fake.add_file(repo, "gemma-3-270m-it-Q4_K_M.gguf", disk=model_path)
        remote = open_remote(repo, endpoint=fake.url)
        facts = read_facts(remote.sources[0])
        local = read_facts(model_path)
        assert facts.arch == local.arch == "gemma3"
        assert facts.layer_bytes == local.layer_bytes and facts.n_vocab == local.n_vocab
        assert 0 < remote.bytes_fetched < 16 * 2**20
        assert remote.bytes_fetched == fake.bytes_sent()
        assert all(r.range for r in fake.content_gets())  # never a whole-file GET
        # Fit before download: plan the remote model for a 6 GB laptop card.
        from localfab.machine.probes import machine_from_profile_name
        from localfab.plan import plan

        result = plan(facts, machine_from_profile_name("rtx3060-laptop-6gb"))
        assert result.fits and result.all_on_gpu
        assert fake.bytes_sent() == remote.bytes_fetched < 16 * 2**20  # planning fetched nothing


def test_range_source_sends_the_token(env: Path, fake: FakeHub, tiny: bytes) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    fake.gate(REPO, "hf_good")
    source = HttpRangeSource(REPO, FILE, token="hf_good")
    assert source.size() == len(tiny)
    assert source.read(0, 4) == b"GGUF"
    assert source.read(len(tiny) - 2, 10) == tiny[-2:]
    assert source.read(len(tiny) + 5, 10) == b""
    assert source.bytes_fetched == 6
    assert {r.authorization for r in fake.requests} == {"Bearer hf_good"}
    with pytest.raises(HubError, match="gated"):
        HttpRangeSource(REPO, FILE).read(0, 4)
