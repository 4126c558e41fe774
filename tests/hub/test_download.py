"""Downloads under hostile or unlucky conditions: foreign hosts, concurrent pulls, stale files,
wrong sizes and hostile names. Everything runs against local fake hubs (`tests/hf_server.py`)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from localfab.errors import HubError, UsageError
from localfab.hub import HttpRangeSource, Hub, HubConfig, open_remote, parse_ref
from localfab.store import Store
from tests.conftest import LOCALFAB
from tests.hf_server import FakeHub
from tests.hub_fixtures import hub
from tests.store.test_store import write_tiny_gguf

REPO = "owner/Tiny-GGUF"
FILE = "Tiny-Q4_K_M.gguf"


def cli_env(fake: FakeHub, tmp_path: Path, **extra: str) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.update(
        LOCALFAB_HOME=str(tmp_path / "home"),
        HF_ENDPOINT=fake.url,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        HF_HOME=str(tmp_path / "hf-home"),
        **extra,
    )
    for var in ("HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(var, None)
    if "HF_TOKEN" not in extra:
        env.pop("HF_TOKEN", None)
    return env


def lf(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args], env=env, input="", capture_output=True, text=True, timeout=120
    )


# the token stays with the configured hub -------------------------------------------------------
def test_pull_of_a_url_on_another_host_sends_no_token(
    env: Path, fake: FakeHub, other: FakeHub, store: Store, tiny: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    other.add_file(REPO, FILE, data=tiny)
    result = hub().pull(f"{other.url}/{REPO}/resolve/main/{FILE}", store=store)
    assert result.entry.path.read_bytes() == tiny
    assert other.requests and {r.authorization for r in other.requests} == {None}
    # By repo URL (listing, HEAD, GET) too, and with an explicit token as well.
    store.remove(result.entry.name)
    Hub(HubConfig.from_env(token="hf_explicit")).pull(f"{other.url}/{REPO}", store=store)
    assert {r.authorization for r in other.requests} == {None}
    # The configured hub still gets it.
    fake.add_file(REPO, FILE, data=tiny)
    store.remove(result.entry.name)
    hub().pull(REPO, store=store)
    assert {r.authorization for r in fake.requests} == {"Bearer hf_secret"}


def test_plan_of_a_url_on_another_host_sends_no_token(
    env: Path, other: FakeHub, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localfab.gguf.facts import read_facts

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    other.add_file(REPO, FILE, data=tiny)
    remote = open_remote(f"{other.url}/{REPO}")
    assert read_facts(remote.sources[0]).arch == "llama"
    ranged = [r for r in other.requests if r.range]
    assert ranged, "the header was read with ranged GETs"
    assert {r.authorization for r in other.requests} == {None}
    # A range source made directly for another host behaves the same.
    source = HttpRangeSource(REPO, FILE, endpoint=other.url)
    assert source.read(0, 4) == b"GGUF"
    assert {r.authorization for r in other.requests} == {None}


def test_cli_pull_and_plan_of_a_foreign_url_send_no_token(
    fake: FakeHub, other: FakeHub, tiny: bytes, tmp_path: Path
) -> None:
    other.add_file(REPO, FILE, data=tiny)
    env = cli_env(fake, tmp_path, HF_TOKEN="hf_secret")
    planned = lf(env, "plan", f"{other.url}/{REPO}", "--profile", "cpu-only-16gb")
    assert "Traceback" not in planned.stderr
    pulled = lf(env, "pull", f"{other.url}/{REPO}/resolve/main/{FILE}", "-q")
    assert pulled.returncode == 0, pulled.stderr
    assert other.requests and {r.authorization for r in other.requests} == {None}
    assert not any("hf_secret" in json.dumps(r.headers) for r in other.requests)


def test_refused_token_less_request_says_why_no_token_was_sent(
    env: Path, other: FakeHub, store: Store, tiny: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    other.add_file(REPO, FILE, data=tiny)
    other.gate(REPO, "hf_secret")
    with pytest.raises(HubError, match=r"401.*no token was sent.*HF_ENDPOINT="):
        hub().pull(f"{other.url}/{REPO}", store=store)
    # The fake records a request after answering it: wait for the record, not for a clock.
    _wait_for(lambda: other.requests, "the refused request to be recorded")
    assert {r.authorization for r in other.requests} == {None}


# two pulls of one model at once ----------------------------------------------------------------
def test_two_concurrent_pulls_download_once_and_both_succeed(
    fake: FakeHub, big: bytes, tmp_path: Path
) -> None:
    fake.add_file(REPO, FILE, data=big)
    release = fake.hold()
    env = cli_env(fake, tmp_path)
    logs = [tmp_path / "first.err", tmp_path / "second.err"]
    procs: list[subprocess.Popen[str]] = []
    try:
        with logs[0].open("w") as err:
            procs.append(_popen(env, err))
        _wait_for(lambda: fake.started_gets() >= 1, "the first pull to start downloading")
        with logs[1].open("w") as err:
            procs.append(_popen(env, err))
        # Either the second pull waits for the first (the fix) or it starts its own download.
        _wait_for(
            lambda: (
                "another localfab is downloading" in logs[1].read_text() or fake.started_gets() >= 2
            ),
            "the second pull to wait or download",
        )
        release.set()
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        release.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
    errs = [log.read_text() for log in logs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert "another localfab is downloading" in errs[1]
    assert "pulled tiny-q4_k_m" in outs[0] and "sha256 verified" in outs[0]
    assert "tiny-q4_k_m" in outs[1]
    store = Store(_paths(tmp_path))
    (entry,) = [e for e in store.list() if e.source == "hub"]
    assert entry.path.read_bytes() == big
    assert entry.sha256 == (hashlib.sha256(big).hexdigest(),)
    assert store.partial_files() == []
    assert fake.bytes_sent(FILE) == len(big)  # downloaded once


def _popen(env: dict[str, str], err: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(LOCALFAB), "pull", REPO],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=err,  # type: ignore[arg-type]
        text=True,
    )


def _wait_for(condition: object, what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _paths(tmp_path: Path):  # noqa: ANN202 - test helper
    from localfab.config import default_paths

    return default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})


# a file already in place but not registered ----------------------------------------------------
def test_unregistered_file_in_place_is_verified_before_registering(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    final = store.download_path(REPO, FILE)
    final.parent.mkdir(parents=True)
    stale = write_tiny_gguf(final, floats=1 << 12).read_bytes()  # a valid GGUF, other bytes
    assert stale != tiny
    result = hub().pull(REPO, store=store)
    assert final.read_bytes() == tiny
    assert result.entry.sha256 == (hashlib.sha256(tiny).hexdigest(),)
    assert fake.bytes_sent(FILE) == len(tiny)


def test_unregistered_file_in_place_that_matches_is_not_downloaded_again(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    final = store.download_path(REPO, FILE)
    final.parent.mkdir(parents=True)
    final.write_bytes(tiny)
    result = hub().pull(REPO, store=store)
    assert result.entry.path == final and result.verified
    assert fake.content_gets() == []
    # Removing it leaves no download folder behind (the idle download lock goes too).
    store.remove(result.entry.name)
    assert not store.repo_dir(REPO).exists()


# messages that say what happened ---------------------------------------------------------------
def test_oversized_partial_restarts_and_does_not_claim_a_resume(
    fake: FakeHub, tiny: bytes, tmp_path: Path
) -> None:
    fake.add_file(REPO, FILE, data=tiny)
    store = Store(_paths(tmp_path))
    partial = store.partial_path(REPO, FILE, hashlib.sha256(tiny).hexdigest())
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"x" * (len(tiny) + 4096))
    proc = lf(cli_env(fake, tmp_path), "pull", REPO)
    assert proc.returncode == 0, proc.stderr
    assert "sha256 verified" in proc.stdout
    assert "resum" not in proc.stdout + proc.stderr
    assert fake.content_gets(FILE)[0].range is None


def test_hub_advertising_too_many_bytes_is_not_an_endless_resume(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    hosted = fake.add_file(REPO, FILE, data=tiny, sha256="0" * 64)
    hosted.advertised = len(tiny) + 1000
    for _ in range(2):  # the second pull must say the same, not "run again to resume"
        with pytest.raises(HubError) as err:
            hub().pull(REPO, store=store)
        message = str(err.value)
        assert f"as {len(tiny) + 1000} bytes" in message
        assert f"sent {len(tiny)} bytes (1000 fewer)" in message
        assert "discarded" in message and "stopped early" not in message
    assert store.partial_files() == []


def test_hub_advertising_the_wrong_size_keeps_a_file_whose_sha256_matches(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    fake.add_file(REPO, FILE, data=tiny).advertised = len(tiny) + 1000
    result = hub().pull(REPO, store=store)
    assert result.entry.path.read_bytes() == tiny and result.verified


def test_resume_past_the_end_of_the_served_file_is_settled(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    """A partial holding every byte the server has (HTTP 416 on resume) is checked, not retried."""
    fake.add_file(REPO, FILE, data=tiny).advertised = len(tiny) + 1000
    partial = store.partial_path(REPO, FILE, hashlib.sha256(tiny).hexdigest())
    partial.parent.mkdir(parents=True)
    partial.write_bytes(tiny)
    result = hub().pull(REPO, store=store)
    assert result.entry.path.read_bytes() == tiny
    assert fake.content_gets(FILE)[-1].status == 416


def test_extra_bytes_are_reported_as_extra_bytes(
    env: Path, fake: FakeHub, store: Store, tiny: bytes
) -> None:
    hosted = fake.add_file(REPO, FILE, data=tiny, sha256="0" * 64)
    hosted.advertised = len(tiny) - 100
    with pytest.raises(HubError) as err:
        hub().pull(REPO, store=store)
    message = str(err.value)
    assert f"sent {len(tiny)} bytes (100 more)" in message and "discarded" in message
    assert "stopped early" not in message and "(0 of" not in message
    assert store.partial_files() == []


def test_a_short_download_is_told_apart_from_a_short_file(
    env: Path, fake: FakeHub, tiny: bytes
) -> None:
    """Whether the server has bytes past what arrived decides "run again" vs "wrong size"."""
    fake.add_file(REPO, FILE, data=tiny)
    from localfab.hub.download import has_more

    url = hub().file_url(REPO, FILE)
    assert has_more(url, {}, len(tiny) - 1)
    assert not has_more(url, {}, len(tiny))


# hostile names ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["evil\x1b]0;pwned\x07-Q4_K_M.gguf", "two\nlines-Q4_K_M.gguf", "bidi\u202e-Q4_K_M.gguf"]
)
def test_control_characters_in_listed_file_names_are_refused(
    env: Path, fake: FakeHub, store: Store, tiny: bytes, tmp_path: Path, name: str
) -> None:
    fake.add_file(REPO, name, data=tiny)
    with pytest.raises(UsageError, match="refusing repo file name") as err:
        hub().pull(REPO, store=store)
    assert "\x1b" not in str(err.value) and "\n" not in str(err.value)
    assert fake.content_gets() == []
    assert not [p for p in tmp_path.rglob("*") if "pwned" in p.name or "lines" in p.name]


def test_control_characters_never_reach_the_terminal(
    fake: FakeHub, tiny: bytes, tmp_path: Path
) -> None:
    fake.add_file(REPO, "evil\x1b]0;pwned\x07-Q4_K_M.gguf", data=tiny)
    proc = lf(cli_env(fake, tmp_path), "pull", REPO)
    assert proc.returncode == 2, proc.stderr
    assert "\x1b" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
    # A 404 message that lists the repo's files leaves such names out too.
    proc = lf(cli_env(fake, tmp_path), "pull", f"{REPO}/Missing-Q4_K_M.gguf")
    assert proc.returncode == 5 and "\x1b" not in proc.stderr


def test_control_characters_in_user_given_names_are_refused(env: Path, store: Store) -> None:
    with pytest.raises(UsageError, match="not a valid model name"):
        hub().pull(REPO, store=store, name="tiny\n")
    with pytest.raises(UsageError, match="refusing repo file name"):
        parse_ref(f"https://huggingface.co/{REPO}/resolve/main/a%1b%5b2J-Q4_K_M.gguf")
    with pytest.raises(UsageError):
        parse_ref("owner/Repo-GGUF\n/x-Q4_K_M.gguf")


def test_server_text_in_error_messages_is_escaped() -> None:
    from localfab.hub.errors import hub_error

    error = hub_error(RuntimeError("boom\x1b]0;pwned\x07\nfake prompt$ "), HubConfig(), repo=REPO)
    assert isinstance(error, HubError)
    assert "\x1b" not in str(error) and "\n" not in str(error)
    assert "\\x1b]0;pwned\\x07" in str(error)
