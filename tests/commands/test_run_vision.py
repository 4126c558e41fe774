"""`localfab run --image FILE --mmproj FILE` and a chat session's images, on the test model
with the synthetic projector (scripts/mmproj_model.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from localfab.errors import UsageError
from tests.commands.test_run_cli import lf
from tests.engine.test_vision import BLUE, MMPROJ, NOISE, model_in_folder


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = MMPROJ.write_projector(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf", 640)
    return path


def test_run_answers_about_an_image(
    model_path: Path, projector: Path, tmp_path: Path, lf_env: dict[str, str]
) -> None:
    image = tmp_path / "noise.png"
    image.write_bytes(NOISE)
    base = ["run", str(model_path), "What is in this picture?", "-n", "4", "--temperature", "0"]
    proc = lf([*base, "--mmproj", str(projector), "--image", str(image), "--json"], lf_env)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    plain = json.loads(lf([*base, "--json"], lf_env).stdout)
    # The prompt holds the image (its tokens and markers) besides the text.
    assert seen["usage"]["prompt_tokens"] >= plain["usage"]["prompt_tokens"] + MMPROJ.IMAGE_TOKENS


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--image", "{image}"], "--image needs the model's vision projector"),
        (["--mmproj", "{projector}", "--image", "{missing}"], "cannot read the image"),
        (["--mmproj", "{projector}", "--image", "{corrupt}"], "could not be decoded"),
        (["--mmproj", "{projector}", "--image", "{text}"], "not an image"),
        (["--mmproj", "{other}", "--image", "{image}"], "mismatch between text model"),
        (["--mmproj", "{projector}", "--image", "{image}", "--raw"], "--raw sends text only"),
    ],
    ids=["no-projector", "missing", "corrupt", "text", "other-model", "raw"],
)
def test_run_bad_images_say_why_in_one_line(
    model_path: Path,
    projector: Path,
    tmp_path: Path,
    lf_env: dict[str, str],
    extra: list[str],
    says: str,
) -> None:
    files = {
        "image": tmp_path / "blue.png",
        "missing": tmp_path / "missing.png",
        "corrupt": tmp_path / "corrupt.png",
        "text": tmp_path / "notes.txt",
        "projector": projector,
        "other": tmp_path / "mmproj-320.gguf",
    }
    files["image"].write_bytes(BLUE)
    files["corrupt"].write_bytes(BLUE[:50])
    files["text"].write_text("not a picture")
    MMPROJ.write_projector(files["other"], 320)
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in extra]
    proc = lf(["run", str(model_path), "What is it?", "-n", "2", *args], lf_env)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("localfab: error")]
    assert len(errors) == 1 and says in errors[0], proc.stderr


def test_a_chat_sends_images_and_the_next_turn_reuses_them(
    model_path: Path, projector: Path
) -> None:
    from localfab.chat.session import ChatSession, Reply
    from localfab.engine import EngineSettings, GenerationOptions, SamplingParams
    from localfab.engine.vision import attach_projector
    from localfab.runtime import load_model

    loaded = load_model(model_path, EngineSettings(n_ctx=1024, n_batch=512))
    try:
        options = GenerationOptions(max_tokens=4, sampling=SamplingParams(temperature=0))
        session = ChatSession(loaded.engine, loaded.prompts)
        with pytest.raises(UsageError, match="reads no images"):
            list(session.send("What is it?", options, images=[NOISE]))
        assert session.messages == []  # the turn that failed left nothing behind
        seeing = attach_projector(loaded.engine, projector, use_gpu=False)
        events: list[Any] = list(session.send("What is it?", options, images=[NOISE, BLUE]))
        assert isinstance(events[-1], Reply)
        assert seeing.n_encoded == 2
        assert sum(t < 0 for t in loaded.engine.cached_tokens) == 2 * MMPROJ.IMAGE_TOKENS
        list(session.send("And now?", options))
        assert seeing.n_encoded == 2  # the images' cells were kept for the next turn
    finally:
        loaded.close()


def test_run_finds_the_projector_beside_the_model(
    model_path: Path, tmp_path: Path, lf_env: dict[str, str]
) -> None:
    model = model_in_folder(model_path, tmp_path / "model")
    MMPROJ.write_projector(model.parent / "mmproj-model-f16.gguf", 640)
    image = tmp_path / "noise.png"
    image.write_bytes(NOISE)
    args = ["run", str(model), "What is it?", "-n", "2", "--json"]
    proc = lf([*args, "--image", str(image)], lf_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["usage"]["prompt_tokens"] > MMPROJ.IMAGE_TOKENS


def test_run_places_images_where_the_prompt_names_them(
    model_path: Path, projector: Path, tmp_path: Path, lf_env: dict[str, str]
) -> None:
    """As llama.cpp's mtmd tools: each <__media__> in the prompt is the next --image."""
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    first.write_bytes(NOISE)
    second.write_bytes(BLUE)
    images = ["--mmproj", str(projector), "--image", str(first), "--image", str(second)]
    base = ["run", str(model_path), "-n", "2", "--json", "--temperature", "0"]
    named = lf([*base, "Is <__media__> darker than <__media__>?", *images], lf_env)
    assert named.returncode == 0, named.stderr
    before = lf([*base, "Is darker than ?", *images], lf_env)
    # The same images and words: as many tokens, the images only placed elsewhere.
    usage = json.loads(named.stdout)["usage"]["prompt_tokens"]
    assert abs(usage - json.loads(before.stdout)["usage"]["prompt_tokens"]) <= 4
    wrong = lf([*base, "Is <__media__> dark?", *images], lf_env)
    assert wrong.returncode != 0
    assert "names 1 image(s) (<__media__>) but 2 were given" in wrong.stderr
