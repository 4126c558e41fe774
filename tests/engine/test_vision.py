"""Images in a prompt: the test model with a synthetic projector (scripts/mmproj_model.py),
loaded, encoded and decoded by llama.cpp's mtmd; everything but the model's eyes is real."""

from __future__ import annotations

import importlib.util
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from localfab.errors import LocalfabError

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mmproj_model", ROOT / "scripts/mmproj_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mmproj_model"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


MMPROJ = _script()


def model_in_folder(model_path: Path, folder: Path) -> Path:
    """The model's own file in `folder` (a hard link, else a copy: a symbolic link would be
    followed to the model's folder), where a projector can lie beside it."""
    import os
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model.gguf"
    try:
        os.link(model_path, model)
    except OSError:
        shutil.copyfile(model_path, model)
    return model


def png(width: int, height: int, pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of `pixels` (height x width x 3)."""
    rows = b"".join(b"\x00" + pixels[y].astype(np.uint8).tobytes() for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


NOISE = png(80, 48, np.random.default_rng(1).integers(0, 256, (48, 80, 3)))
BLUE = png(80, 48, np.tile(np.array([0, 0, 255]), (48, 80, 1)))


@pytest.fixture(scope="module")
def seeing(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An engine of its own (the shared one stays text-only) with the projector attached."""
    from localfab.engine import Engine, EngineSettings
    from localfab.engine.vision import attach_projector

    path = MMPROJ.write_projector(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf", 640)
    engine = Engine(model_path, EngineSettings(n_ctx=1024, n_batch=512))
    attach_projector(engine, path, use_gpu=False)
    yield engine
    engine.close()


def prompt(engine: Any, image: bytes | None, question: str = "What is this?") -> list[int]:
    head = engine.tokenize("<start_of_turn>user\n", add_special=True, parse_special=True)
    tail = engine.tokenize(
        f"{question}<end_of_turn>\n<start_of_turn>model\n", add_special=False, parse_special=True
    )
    picture = [] if image is None else engine.projector.image_tokens(image)
    return [*head, *picture, *tail]


def next_logits(engine: Any, tokens: list[int]) -> np.ndarray:
    engine.clear_cache()
    engine.evaluate(tokens)
    return np.array(engine.kv.logits(), dtype=np.float32)


def test_an_image_changes_the_next_token_and_the_same_image_gives_the_same(seeing: Any) -> None:
    tokens = prompt(seeing, NOISE)
    image = [t for t in tokens if t < 0]
    assert len(image) == MMPROJ.IMAGE_TOKENS
    # The model's own markers around the image (Gemma 3's <start_of_image> ... <end_of_image>).
    first = tokens.index(image[0])
    assert seeing.token_text(tokens[first - 1]) == "<start_of_image>"
    assert seeing.token_text(tokens[first + len(image)]) == "<end_of_image>"
    encoded = seeing.projector.n_encoded
    noise = next_logits(seeing, tokens)
    again = next_logits(seeing, prompt(seeing, NOISE))
    blue = next_logits(seeing, prompt(seeing, BLUE))
    assert seeing.projector.n_encoded == encoded + 3
    assert np.array_equal(noise, again)
    assert float(np.abs(noise - blue).max()) > 0.1
    assert seeing.kv.cached == prompt(seeing, BLUE)  # the cache mirrors text and image ids


def test_the_next_turn_does_not_encode_the_image_again(seeing: Any) -> None:
    turn = prompt(seeing, NOISE)
    seeing.clear_cache()
    seeing.evaluate(turn)
    encoded = seeing.projector.n_encoded
    follow = [*turn, *seeing.tokenize(" It is noise.", add_special=False, parse_special=False)]
    reused = seeing.evaluate(follow)
    assert reused == len(turn)  # the image's cells were kept, and the text around it
    assert seeing.projector.n_encoded == encoded


def test_a_shift_removes_an_image_whole(seeing: Any) -> None:
    tokens = prompt(seeing, BLUE)
    seeing.clear_cache()
    seeing.evaluate(tokens)
    first = next(i for i, t in enumerate(tokens) if t < 0)
    seeing.drop_span(first + 3, first + 5)  # inside the image: all of it leaves
    assert not any(t < 0 for t in seeing.kv.cached)
    assert len(seeing.kv.cached) == len(tokens) - MMPROJ.IMAGE_TOKENS


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"just some text, not a picture", "not an image llama.cpp can read"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "corrupt or cut short"),
        (NOISE[:60], "could not be decoded"),
        (NOISE[:33] + b"\x00" * 200, "could not be decoded"),
        (png(1, 1, np.zeros((1, 1, 3)))[:16] + struct.pack(">II", 100_000, 100_000), "scale it"),
    ],
    ids=["text", "short-header", "cut-png", "corrupt-png", "huge"],
)
def test_bad_images_get_one_clear_line(seeing: Any, data: bytes, says: str) -> None:
    with pytest.raises(LocalfabError, match=says) as caught:
        seeing.projector.image_tokens(data)
    assert "\n" not in str(caught.value)


def test_a_projector_for_another_model_is_refused_at_load(
    model_path: Path, tmp_path: Path, seeing: Any
) -> None:
    from localfab.engine.vision import Projector

    other = MMPROJ.write_projector(tmp_path / "mmproj-320.gguf", 320)
    with pytest.raises(LocalfabError, match=r"mismatch.*640.*320") as caught:
        Projector(seeing.model, seeing.ctx, other, n_threads=2, use_gpu=False)
    assert "mmproj-320.gguf" in str(caught.value)
    with pytest.raises(LocalfabError, match="does not exist"):
        Projector(seeing.model, seeing.ctx, tmp_path / "missing.gguf", n_threads=2)
    # The text model itself given as its projector.
    with pytest.raises(LocalfabError, match="is it a vision projector"):
        Projector(seeing.model, seeing.ctx, model_path, n_threads=2, use_gpu=False)


def test_parallel_slots_each_with_an_image(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two slots decoding together, each prompt with its image: each image is encoded once into
    its own slot's sequence, beside the other's text steps, and both replies run to their end."""
    from localfab.engine import Done, Engine, EngineSettings, GenerationOptions, SamplingParams
    from localfab.engine.batch import BatchDecoder
    from localfab.engine.vision import attach_projector

    path = MMPROJ.write_projector(tmp_path_factory.mktemp("mmproj2") / "mmproj.gguf", 640)
    engine = Engine(model_path, EngineSettings(n_ctx=2048, n_batch=512, n_seq_max=2))
    try:
        projector = attach_projector(engine, path, use_gpu=False)
        decoder = BatchDecoder(engine, 2)
        prompts = [prompt(engine, NOISE), prompt(engine, BLUE, "And this one?")]
        opts = GenerationOptions(max_tokens=6, sampling=SamplingParams(temperature=0))
        for slot, tokens in zip(decoder.slots, prompts, strict=True):
            decoder.start(slot, tokens, opts)
        done: dict[int, Done] = {}
        while decoder.busy:
            for res in decoder.step():
                assert res.error is None, res.error
                for event in res.events:
                    if isinstance(event, Done):
                        done[res.slot.id] = event
        assert sorted(done) == [0, 1] and all(d.tokens for d in done.values())
        assert projector.n_encoded == 2
        for slot, tokens in zip(decoder.slots, prompts, strict=True):
            assert slot.kv.cached[: len(tokens)] == tokens
            assert slot.kv.pos_max() + 1 == len(slot.kv.cached)  # cells as the mirror says
        decoder.close()
    finally:
        engine.close()


def distinct_images(count: int, seed: int = 0) -> list[bytes]:
    """`count` small PNGs whose image ids differ (ids are a short hash: of a few hundred
    random images, two may share theirs)."""
    import hashlib

    from localfab.engine.image_ids import run_ids

    rng = np.random.default_rng(seed)
    images: dict[int, bytes] = {}
    while len(images) < count:
        image = png(16, 16, rng.integers(0, 256, (16, 16, 3)))
        images.setdefault(run_ids(hashlib.sha256(image).hexdigest(), 1)[0], image)
    return list(images.values())


def test_a_held_image_is_kept_until_let_go(seeing: Any) -> None:
    """A request's images (its hold) stay prepared while other images come, more than are
    kept for later turns; let go (or dropped), only those kept for later turns stay."""
    import gc

    from localfab.engine.vision import KEPT_IMAGES

    projector = seeing.projector
    n = KEPT_IMAGES + 8
    images = distinct_images(3 * n, seed=7)
    hold = projector.hold()
    mine = [projector.image_tokens(i, hold=hold) for i in images[:n]]
    for image in images[n : 2 * n]:  # other requests' images meanwhile
        projector.image_tokens(image)
    head = seeing.tokenize("<start_of_turn>user\n", add_special=True, parse_special=True)
    tail = seeing.tokenize(
        "Same?<end_of_turn>\n<start_of_turn>model\n", add_special=False, parse_special=True
    )
    tokens = [*head, *(t for image in mine for t in image), *tail]
    encoded = projector.n_encoded
    next_logits(seeing, tokens)  # every one of them is still there to encode
    assert projector.n_encoded == encoded + len(mine)
    assert projector.n_kept >= len(mine)
    hold.release()
    assert projector.n_kept == KEPT_IMAGES
    dropped = projector.hold()
    for image in images[2 * n :]:
        projector.image_tokens(image, hold=dropped)
    assert projector.n_kept == 2 * KEPT_IMAGES + 8
    del dropped  # a request that failed before it ran: its images go too
    gc.collect()
    projector.image_tokens(BLUE)
    assert projector.n_kept == KEPT_IMAGES


def test_a_request_cannot_hold_more_images_than_its_context_takes(seeing: Any) -> None:
    """What one request pins is bounded: images beyond what the whole context could hold
    (and beyond those any request may keep) are refused with a line that says what to do."""
    projector = seeing.projector
    hold = projector.hold()
    fits = projector.n_ctx // MMPROJ.IMAGE_TOKENS
    images = distinct_images(fits + 1, seed=10)
    for image in images[:fits]:
        projector.image_tokens(image, hold=hold)
    with pytest.raises(LocalfabError, match="more than the context's 1024 tokens: send fewer"):
        projector.image_tokens(images[fits], hold=hold)
    projector.image_tokens(images[0], hold=hold)  # one it holds already may come again
    hold.release()
