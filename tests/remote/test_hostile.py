"""A remote server that sends what no model server should: escape sequences in its error, one
event of tens of MiB, a reply without end, tool calls nobody offered; and the mistakes a new
user makes with `run --remote`. Through the installed console script and the client, against
the llama-server look-alike over real sockets."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from localfab.remote.client import MAX_EVENT_BYTES, Remote, RemoteClient, RemoteError
from tests.conftest import LOCALFAB
from tests.remote.fakeremote import FakeRemote, fake_remote

# Runs a command and prints, as its last line, the command's exit status and peak resident
# memory (KiB on Linux): the child's own, whatever else this test process ran before.
PEAK = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, stdin=subprocess.DEVNULL)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": done.returncode, "out": done.stdout, "err": done.stderr, "peak": peak}))
"""


@pytest.fixture()
def remote() -> Iterator[tuple[FakeRemote, str]]:
    with fake_remote() as pair:
        yield pair


def _run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), "run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _peak(env: dict[str, str], *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(LOCALFAB), "run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


# --- finding 9: a server's error text on the terminal -----------------------------------------


def test_an_error_body_with_escape_sequences_is_shown_not_obeyed(
    remote: tuple[FakeRemote, str], lf_env: dict[str, str]
) -> None:
    fake, url = remote
    fake.mode = "500"
    fake.message = "\x1b]0;pwned\x07 and \x1b]52;c;cm0gLXJmIH4=\x07 \x9b2J done"
    done = _run(lf_env, "--remote", url, "-", "Hi")
    assert done.returncode != 0
    assert "failed (500)" in done.stderr
    # The sequences are there to read (as control pictures), none reaches the terminal.
    assert "␛]0;pwned␇" in done.stderr and "␛]52;c;cm0gLXJmIH4=␇" in done.stderr
    assert not any(c in done.stderr for c in "\x1b\x07\x9b"), repr(done.stderr)


# --- finding 10: events and replies without bounds --------------------------------------------


def test_a_huge_event_ends_the_reply_at_once_in_bounded_memory(
    remote: tuple[FakeRemote, str], lf_env: dict[str, str]
) -> None:
    fake, url = remote
    base = _peak(lf_env, "--remote", url, "-", "Hi")
    assert base["rc"] == 0, base["err"]
    fake.mode, fake.huge = "huge", 50 << 20
    started = time.monotonic()
    done = _peak(lf_env, "--remote", url, "-", "Hi")
    took = time.monotonic() - started
    # At most the bound and a read's worth more is held, never the 50 MiB (nor its copies).
    grew = (int(str(done["peak"])) - int(str(base["peak"]))) * 1024
    assert grew < MAX_EVENT_BYTES * 3, f"{grew / 2**20:.0f} MiB more at the peak, {took:.1f} s"
    assert done["rc"] != 0
    assert "sent an event over 8 MiB: stopped" in str(done["err"]), done["err"]
    assert "Traceback" not in str(done["err"])
    assert done["out"] == ""  # nothing of the event was printed
    assert took < 30, f"{took:.0f} s"


def test_a_reply_without_end_is_cut_with_a_clear_error(
    remote: tuple[FakeRemote, str], lf_env: dict[str, str]
) -> None:
    """Events of a MiB each, each under the bound, add up to a reply over the reply's bound:
    it stops there with a line that says so (the text so far is printed)."""
    fake, url = remote
    fake.chunks, fake.n_ctx = ["y" * (1 << 20)] * 5, 1 << 30  # the window is no limit
    fake.send_tokens = False  # (a MiB of ids an event only makes the test slow)
    done = _run(lf_env, "--remote", url, "-", "Hi", "-n", "-1")
    assert done.returncode != 0
    assert "sent a reply over 4 MiB: stopped; the reply so far is kept" in done.stderr
    assert 3 << 20 < len(done.stdout) <= 4 << 20


def test_stopping_during_a_slow_huge_event(remote: tuple[FakeRemote, str]) -> None:
    """A server trickling one endless event: stopping ends the stream at once, and the
    connection is closed (the server sees it go)."""
    fake, url = remote
    fake.mode, fake.huge, fake.huge_pause = "huge", 7 << 20, 0.2
    client = RemoteClient(Remote(url))
    cancel = threading.Event()
    ended = threading.Event()
    got: list[object] = []

    def read() -> None:
        try:
            got.extend(client.events("/completion", {"prompt": [1]}, cancel))
        finally:
            ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.6)  # a few MiB in, the event not ended
    assert not ended.is_set()
    cancel.set()
    assert ended.wait(1.0), "the stream went on after the stop"
    assert got == []
    assert fake.disconnected.wait(5.0), "the connection stayed open"
    client.close()


def test_a_huge_event_through_the_client_is_one_error(remote: tuple[FakeRemote, str]) -> None:
    fake, url = remote
    fake.mode, fake.huge = "huge", 20 << 20
    client = RemoteClient(Remote(url, name="box"))
    with pytest.raises(RemoteError, match="box sent an event over 8 MiB: stopped") as caught:
        list(client.events("/completion", {"prompt": [1]}))
    assert caught.value.dropped
    client.close()


# --- finding 16: what a new user meets ----------------------------------------------------------


def test_a_question_taken_for_the_model_says_how_to_ask(
    remote: tuple[FakeRemote, str], lf_env: dict[str, str]
) -> None:
    fake, url = remote
    done = _run(lf_env, "--remote", url, "What is the capital of France?")
    assert done.returncode == 2
    assert "'What is the capital of France?' was taken for the model's name" in done.stderr
    assert f"localfab run --remote {url} - 'What is the capital of France?'" in done.stderr
    assert fake.requests == []  # nothing was asked of the server under that name
    one_word = _run(lf_env, "--remote", url, "hello")
    assert one_word.returncode == 2
    assert "no prompt: 'hello' was taken for the model's name" in one_word.stderr
    assert f"localfab run --remote {url} - hello" in one_word.stderr
    # The forms it suggests work.
    done = _run(lf_env, "--remote", url, "-", "What is the capital of France?")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Hello there"


def test_an_unoffered_tool_call_from_a_chat_api_stays_visible(
    remote: tuple[FakeRemote, str], lf_env: dict[str, str]
) -> None:
    """An OpenAI-compatible server's calls (whole, and one whose arguments are cut JSON) are
    not run (a chat API gets no tools yet), and not dropped either: the reply shows them."""
    fake, url = remote
    fake.flavor = "openai"
    fake.tool_calls = [
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"'},
        },
        {"index": 1, "id": "call_2", "function": {"name": "add", "arguments": '{"a": 1'}},
        {"index": 1, "function": {"arguments": ', "b": 2}'}},
    ]
    done = _run(lf_env, "--remote", url, "fake-chat", "Weather?")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "Hello there"
    assert lines[-2] == (
        '[tool call get_weather {"city": "Paris": not run; its arguments are not valid JSON; '
        "tools through a chat API are not supported yet]"
    )
    assert lines[-1] == (
        '[tool call add {"a": 1, "b": 2}: not run; tools through a chat API are not supported yet]'
    )
