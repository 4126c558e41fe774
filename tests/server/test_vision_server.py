"""Images through the server: OpenAI image_url parts in a chat and llama-server's
multimodal_data, on the test model with the synthetic projector (scripts/mmproj_model.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.test_vision import BLUE, MMPROJ, NOISE, distinct_images
from tests.serverproc import serve_in_process


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = MMPROJ.write_projector(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf", 640)
    return path


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("media")
    (folder / "blue.png").write_bytes(BLUE)
    (folder.parent / "outside.png").write_bytes(BLUE)
    (folder / "link.png").symlink_to(folder.parent / "outside.png")
    return folder


def serve(
    model_path: Path, projector: Path, media: Path, slots: int, **extra: Any
) -> Iterator[Any]:
    from localfab.engine import EngineSettings
    from localfab.engine.vision import attach_projector
    from localfab.runtime import load_model
    from localfab.server import ServerSettings

    engine = EngineSettings(n_ctx=2048, n_batch=512, n_seq_max=slots, kv_unified=slots > 1, **extra)
    loaded = load_model(model_path, engine)
    attach_projector(loaded.engine, projector, use_gpu=False)
    settings = ServerSettings(n_parallel=slots, media_path=media, temperature=0.0)
    for url in serve_in_process(loaded, settings):
        yield url, loaded.engine.projector


@pytest.fixture(scope="module", params=[1, 4], ids=["np1", "np4"])
def server(
    request: pytest.FixtureRequest, model_path: Path, projector: Path, media: Path
) -> Iterator[Any]:
    yield from serve(model_path, projector, media, request.param)


@pytest.fixture(scope="module")
def one_slot(model_path: Path, projector: Path, media: Path) -> Iterator[Any]:
    """One slot, so that requests queue behind each other; one thread, as each image is a
    decode of its own (threads that wait for each other on a busy machine make many slow)."""
    yield from serve(model_path, projector, media, 1, n_threads=1)


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def ask(
    url: str,
    image_url: str,
    text: str = "What is in this picture?",
    *,
    timeout: float = 120,
    **extra: Any,
) -> Any:
    content = [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": image_url}},
    ]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 6, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def test_a_chat_with_an_image_streamed_and_not(server: Any) -> None:
    url, projector = server
    encoded = projector.n_encoded
    plain = ask(url, data_url(NOISE))
    assert plain.status_code == 200, plain.text
    answer = plain.json()
    assert answer["choices"][0]["message"]["content"]
    # The prompt holds the image's 16 tokens and its two markers besides the text.
    text_only = httpx.post(
        url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "What is in this picture?\n"}],
            "max_tokens": 1,
        },
    ).json()
    extra = answer["usage"]["prompt_tokens"] - text_only["usage"]["prompt_tokens"]
    assert extra >= MMPROJ.IMAGE_TOKENS
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json={
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": data_url(BLUE)}}],
                }
            ],
            "max_tokens": 6,
            "stream": True,
        },
        timeout=120,
    ) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    assert projector.n_encoded > encoded


def test_the_next_turn_does_not_encode_the_image_again(server: Any) -> None:
    url, projector = server
    content = [
        {"type": "image_url", "image_url": {"url": data_url(BLUE)}},
        {"type": "text", "text": "Describe it."},
    ]
    first = [{"role": "user", "content": content}]
    r1 = httpx.post(
        url + "/v1/chat/completions", json={"messages": first, "max_tokens": 4}, timeout=120
    )
    assert r1.status_code == 200, r1.text
    encoded = projector.n_encoded
    said = r1.json()["choices"][0]["message"]["content"]
    follow = [*first, {"role": "assistant", "content": said}, {"role": "user", "content": "And?"}]
    r2 = httpx.post(
        url + "/v1/chat/completions", json={"messages": follow, "max_tokens": 4}, timeout=120
    )
    assert r2.status_code == 200, r2.text
    assert projector.n_encoded == encoded  # its cells were reused with the turn's prefix
    cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= r1.json()["usage"]["prompt_tokens"] - 1


def test_props_and_models_say_vision(server: Any) -> None:
    url, _ = server
    assert httpx.get(url + "/props").json()["modalities"]["vision"] is True
    (model,) = httpx.get(url + "/models").json()["models"]
    assert "multimodal" in model["capabilities"]


def test_completion_with_multimodal_data(server: Any) -> None:
    url, _ = server
    prompt = {
        "prompt_string": "<start_of_turn>user\n<__media__> What is this?<end_of_turn>\n"
        "<start_of_turn>model\n",
        "multimodal_data": [base64.b64encode(NOISE).decode()],
    }
    r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 4}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_evaluated"] > MMPROJ.IMAGE_TOKENS
    prompt["multimodal_data"] *= 2
    r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 4}, timeout=120)
    assert r.status_code == 400 and "does not match" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("image_url", "says"),
    [
        ("data:image/png;base64," + base64.b64encode(b"plain text").decode(), "not an image"),
        (data_url(NOISE[:40]), "could not be decoded"),
        ("data:text/plain;base64,aGk=", "Invalid uri format"),
        ("https://example.com/cat.png", "not fetched from the web"),
        ("file://../outside.png", "file path is not allowed"),
        ("file://link.png", "file path is not allowed"),
        ("file://missing.png", "file does not exist"),
        ("!!!", "Invalid base64"),
    ],
    ids=["text", "corrupt", "not-image-type", "web", "dotdot", "link-out", "missing", "junk"],
)
def test_bad_images_are_400s_that_say_why(server: Any, image_url: str, says: str) -> None:
    url, _ = server
    r = ask(url, image_url)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]


def test_a_client_cannot_name_an_image_by_its_ids(server: Any) -> None:
    """Image ids come only from a request's own images: token ids a client sends never
    reach another request's image (the projector keeps recent images by their ids)."""
    url, projector = server
    assert ask(url, data_url(NOISE)).status_code == 200
    from localfab.engine.image_ids import run_ids

    # The first id of the image just sent: mtmd names an image by its bytes' SHA-256.
    held = run_ids(hashlib.sha256(NOISE).hexdigest(), MMPROJ.IMAGE_TOKENS)[0]
    r = httpx.post(url + "/completion", json={"prompt": [2, held, 5], "n_predict": 2}, timeout=60)
    assert r.status_code == 400 and "invalid tokens" in r.json()["error"]["message"]


def test_an_image_from_the_media_folder(server: Any) -> None:
    url, _ = server
    r = ask(url, "file://blue.png")
    assert r.status_code == 200, r.text


def test_serve_with_mmproj_and_its_errors(
    model_path: Path, projector: Path, media: Path, tmp_path: Path
) -> None:
    """The real command: --mmproj and --media-path wired; a projector for another model, or
    --media-path that is no folder, end it with one line that says so."""
    import subprocess

    from tests.serverproc import LOCALFAB, serve

    with serve(
        model_path, "--mmproj", str(projector), "--media-path", str(media), "-c", "1024"
    ) as s:
        assert httpx.get(s.url + "/props").json()["modalities"]["vision"] is True
        assert ask(s.url, "file://blue.png").status_code == 200
        log = s.stop()
    # Its plan beside the model: where it went, what it holds, what an image costs.
    assert re.search(
        r"vision projector mmproj\.gguf: [\d.]+ KiB weights \+ [\d.]+ KiB compute on "
        r"the CPU; .*; an image takes 16 tokens of the context",
        log,
    ), log
    other = MMPROJ.write_projector(tmp_path / "mmproj-320.gguf", 320)
    for args, says in (
        (["--mmproj", str(other)], "mismatch between text model (n_embd = 640) and mmproj"),
        (["--mmproj", str(model_path)], "is not a vision projector"),
        (["--mmproj", str(projector), "--media-path", str(tmp_path / "no")], "is not a folder"),
    ):
        done = subprocess.run(
            [str(LOCALFAB), "serve", str(model_path), "--port", "0", "-c", "1024", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode != 0
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
        assert errors and says in errors[-1], done.stderr


def test_a_full_window_drops_the_turn_with_the_image_whole(
    model_path: Path, projector: Path, media: Path
) -> None:
    """With --context-shift, a chat longer than the window leaves its oldest turns out: the
    turn that holds the image leaves whole (its markers and ids with it), nothing half."""
    from localfab.engine import EngineSettings
    from localfab.engine.vision import attach_projector
    from localfab.runtime import load_model
    from localfab.server import ServerSettings

    loaded = load_model(model_path, EngineSettings(n_ctx=256, n_batch=256))
    attach_projector(loaded.engine, projector, use_gpu=False)
    settings = ServerSettings(context_shift=True, temperature=0.0)
    image = {"type": "image_url", "image_url": {"url": data_url(NOISE)}}
    long = "The lighthouse keeper climbed the spiral stairs to light the lamp. " * 8
    chat = [
        {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": long},
        {"role": "user", "content": long + " Why?"},
    ]
    for url in serve_in_process(loaded, settings):
        whole = httpx.post(url + "/apply-template", json={"messages": chat}).json()["prompt"]
        assert "<__media__>" in whole
        r = httpx.post(
            url + "/v1/chat/completions", json={"messages": chat, "max_tokens": 4}, timeout=120
        )
        assert r.status_code == 200, r.text
        # Only the last turn was kept: the image's turn (markers, ids and text) left whole.
        assert r.json()["usage"]["prompt_tokens"] < 256
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"messages": chat[:1], "max_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > MMPROJ.IMAGE_TOKENS


def test_an_image_with_tools_keeps_its_place(server: Any) -> None:
    """A request with tools copies the messages (the tools may be described in the system
    message): the image still reaches the prompt."""
    url, _ = server
    tool = {"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}
    text = "Describe it, or call look."
    seen = ask(url, data_url(BLUE), text, tools=[tool])
    assert seen.status_code == 200, seen.text
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "tools": [tool]}
    blind = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
    extra = seen.json()["usage"]["prompt_tokens"] - blind["usage"]["prompt_tokens"]
    assert extra >= MMPROJ.IMAGE_TOKENS


def test_serve_finds_the_projector_beside_the_model(model_path: Path, tmp_path: Path) -> None:
    """The mmproj*.gguf beside the model file (where pull puts it) is loaded without --mmproj;
    --no-mmproj leaves it."""
    from tests.engine.test_vision import model_in_folder
    from tests.serverproc import serve

    model = model_in_folder(model_path, tmp_path / "model")
    MMPROJ.write_projector(model.parent / "mmproj-model-f16.gguf", 640)
    for extra, vision in (((), True), (("--no-mmproj",), False)):
        with serve(model, "-c", "1024", *extra) as s:
            assert httpx.get(s.url + "/props").json()["modalities"]["vision"] is vision
            s.stop()


def many_images(url: str, images: list[bytes]) -> httpx.Response:
    content: list[dict[str, Any]] = [{"type": "text", "text": "Which differ?"}]
    content += [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 2}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=300)


def test_more_images_than_are_kept_in_one_request(one_slot: Any) -> None:
    """A prompt's images stay prepared until it is evaluated, however many it holds: more
    than the projector keeps for later turns (KEPT_IMAGES) are no 500."""
    from localfab.engine.vision import KEPT_IMAGES

    url, _ = one_slot
    count = KEPT_IMAGES + 18
    r = many_images(url, distinct_images(count, seed=50))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > count * MMPROJ.IMAGE_TOKENS
    count = KEPT_IMAGES + 2  # llama-server's prompt: held alike
    images = distinct_images(count, seed=51)
    prompt = {
        "prompt_string": "<__media__>" * count + " Which differ?",
        "multimodal_data": [base64.b64encode(i).decode() for i in images],
    }
    r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 2}, timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["tokens_evaluated"] > count * MMPROJ.IMAGE_TOKENS


def test_clients_whose_images_together_are_more_than_are_kept(one_slot: Any) -> None:
    """Three clients with 20 images each at once (60 in flight, queued behind each other on
    one slot): every one is answered."""
    from concurrent.futures import ThreadPoolExecutor

    url, _ = one_slot
    with ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(lambda k: many_images(url, distinct_images(20, seed=100 + k)), range(3))
        )
    for r in answers:
        assert r.status_code == 200, r.text


def test_a_pipe_in_the_media_folder_is_refused_at_once(server: Any, media: Path) -> None:
    """A client's file:// URL naming a FIFO (no regular file) is a 400 at once: it does not
    hold a thread waiting for a writer, so a dozen of them leave the server answering."""
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    url, _ = server
    pipe = media / "pipe.png"
    os.mkfifo(pipe)
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda _: ask(url, "file://pipe.png", timeout=20), range(16)))
        for r in answers:
            assert r.status_code == 400, r.text
            assert "not a regular file" in r.json()["error"]["message"]
        assert time.monotonic() - t0 < 20
        assert ask(url, "file://blue.png", timeout=20).status_code == 200
    finally:
        _release_readers(pipe)
        pipe.unlink()


def _release_readers(pipe: Path) -> None:
    """Open the FIFO for writing while readers wait on it (a server that blocks on it
    would keep its threads otherwise), until none has come for a while."""
    import errno
    import os
    import time

    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 2:
        try:
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
            quiet_since = time.monotonic()
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader waits
                raise
            time.sleep(0.05)
