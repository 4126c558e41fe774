"""Images in requests, for a model served with a vision projector (`--mmproj`).

Chat messages carry OpenAI's `image_url` parts (a `data:` URL, raw base64, or `file://` under
`--media-path`, as llama-server reads them); `/completion` takes llama-server's
`{"prompt_string": "... <__media__> ...", "multimodal_data": [base64, ...]}`. Each image becomes
the projector's tokens (`engine.vision`): in a chat, the message's text gets the media marker
where the image was, and its tokens (text as plain text, each image as its tokens) are pinned
where the chat template places that text. Without a projector, media get llama-server's error.

A request's images stay prepared until its prompt has been evaluated: the projector's hold on
them (`image_ids.ImageHold`) goes with the prompt's tokens (`HeldTokens`) to its jobs.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localfab.chat.images import NOT_PLACED, count_images
from localfab.engine.image_ids import HeldTokens, ImageHold
from localfab.errors import LocalfabError
from localfab.server.errors import ApiError

if TYPE_CHECKING:
    from localfab.engine.vision import Projector

# Content parts that carry media, and the kind llama-server's error names.
MEDIA_PARTS = {"image_url": "image", "input_audio": "audio", "input_video": "video"}
MEDIA_PARTS["video_url"] = "video"
MAX_IMAGE_BYTES = 20 << 20  # larger files are refused before they are read
# What llama-server refuses in a file:// path under --media-path (fs_validate_filename).
_BAD_PATH = re.compile(r'\.\.|[:*?"<>|\x00-\x1f]|^\s|\s$|\.$')


def not_supported(kind: str) -> ApiError:
    """llama-server's 500 for media a model cannot read, naming the missing projector."""
    return ApiError(
        f"{kind} input is not supported - hint: if this is unexpected, "
        "you may need to provide the mmproj",
        "server_error",
    )


def refuse_media(messages: Sequence[Any]) -> None:
    """`not_supported` for the first media part of a chat with a model that reads none."""
    for message in messages:
        for part in _parts(message):
            if kind := MEDIA_PARTS.get(str(part.get("type"))):
                raise not_supported(kind)


def _parts(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []


def image_bytes(url: str, media_path: Path | None) -> bytes:
    """The bytes an image part's URL names, as llama-server reads them; ApiError (400) for one
    it cannot read."""
    if url.startswith("data:"):
        head, comma, data = url.partition(",")
        if not comma:
            raise ApiError("Invalid uri-encoded base64 value")
        if not head.startswith("data:image/"):
            raise ApiError(f"Invalid uri format: {head}")
        if not head.endswith("base64"):
            raise ApiError("uri must be base64 encoded")
        return _base64(data)
    if url.startswith("file://"):
        return _media_file(url[len("file://") :], media_path)
    if url.startswith(("http://", "https://")):
        raise ApiError("images are not fetched from the web here: send it as a data: URL")
    return _base64(url)


def _base64(data: str) -> bytes:
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ApiError(f"the image is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        raw = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        raw = b""
    if not raw:
        raise ApiError("Invalid base64 value")
    return raw


def _media_file(rel: str, media_path: Path | None) -> bytes:
    """A file under --media-path, never outside it (a link that leads out is refused too)."""
    if media_path is None:
        raise ApiError("file:// URLs are not allowed unless --media-path is specified")
    if not rel or _BAD_PATH.search(rel):
        raise ApiError(f"file path is not allowed: {rel}")
    root = media_path.resolve()
    path = (root / rel.lstrip("/")).resolve()
    if not path.is_relative_to(root):
        raise ApiError(f"file path is not allowed: {rel}")
    try:
        # Not blocking: a FIFO or a device would hold this thread until something wrote to it.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        raise ApiError(f"file does not exist or cannot be opened: {rel}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ApiError(f"file is not a regular file: {rel}")
        if info.st_size > MAX_IMAGE_BYTES:
            raise ApiError(f"the image is larger than {MAX_IMAGE_BYTES >> 20} MiB: {rel}")
        try:
            data = file.read(MAX_IMAGE_BYTES + 1)
        except OSError:
            raise ApiError(f"file does not exist or cannot be opened: {rel}") from None
    if len(data) > MAX_IMAGE_BYTES:  # it grew after it was measured
        raise ApiError(f"the image is larger than {MAX_IMAGE_BYTES >> 20} MiB: {rel}")
    return data


class TakenImages(dict[int, list[list[int]]]):
    """For each message with images (by index), their tokens in order; `hold` keeps them
    prepared (None: no images)."""

    hold: ImageHold | None = None


def take_images(
    messages: list[Any], projector: Projector, media_path: Path | None
) -> tuple[list[Any], TakenImages]:
    """The messages with each image part as the media marker's text, and their images."""
    out: list[Any] = []
    images = TakenImages()
    for i, message in enumerate(messages):
        parts = _parts(message)
        if not any(p.get("type") in MEDIA_PARTS for p in parts):
            out.append(message)
            continue
        kept: list[dict[str, Any]] = []
        for part in parts:
            kind = MEDIA_PARTS.get(str(part.get("type")))
            if kind is None:
                kept.append(part)
                continue
            if kind != "image":
                raise not_supported(kind)
            if images.hold is None:
                images.hold = projector.hold()
            images.setdefault(i, []).append(_image(part, projector, media_path, images.hold))
            kept.append({"type": "text", "text": projector.marker})
        out.append({**message, "content": kept})
    return out, images


def _image(
    part: dict[str, Any], projector: Projector, media_path: Path | None, hold: ImageHold
) -> list[int]:
    given = part.get("image_url")
    url = given.get("url") if isinstance(given, dict) else given
    if not isinstance(url, str) or not url:
        raise ApiError("an image_url part needs image_url.url")
    try:
        return projector.image_tokens(image_bytes(url, media_path), hold=hold)
    except LocalfabError as exc:
        raise ApiError(str(exc)) from exc


def pinned_images(
    messages: Sequence[Mapping[str, Any]],
    images: Mapping[int, list[list[int]]],
    marker: str,
    tokenize: Callable[[str], list[int]],
) -> dict[int, list[int]]:
    """For each message with images (`messages` validated: their text joined), its content's
    tokens: the text around each marker as plain text, each image as its tokens."""
    pins: dict[int, list[int]] = {}
    for i, runs in images.items():
        pieces = str(messages[i].get("content") or "").split(marker)
        if len(pieces) != len(runs) + 1:
            raise ApiError(f"messages[{i}]: its text holds the media marker {marker}: remove it")
        tokens = tokenize(pieces[0])
        for run, piece in zip(runs, pieces[1:], strict=True):
            tokens += run + tokenize(piece)
        pins[i] = tokens
    return pins


# --- a chat's images, as the chat path uses them ---------------------------------------------


class Pins:
    """A chat's messages that hold images (by identity: windows are slices of the same
    messages): their content's tokens, and how many images each holds."""

    def __init__(self, hold: ImageHold | None = None) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.count: dict[int, int] = {}
        self.lost = 0  # images whose message could not be followed (`follow`)
        self.hold = hold  # keeps the images prepared while the prompt may be evaluated

    def __bool__(self) -> bool:
        return bool(self.tokens) or bool(self.lost)

    def follow(
        self, before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
    ) -> None:
        """The messages were copied (`tool_messages`; a system message may have been put
        first): the pins go to the copies, matched from the end, where their text is the
        same (a system message given the tools' description loses its pin, and the request
        is then refused for images it cannot place, never sent without them)."""
        shift = len(after) - len(before)
        for i, message in enumerate(before):
            if id(message) not in self.tokens:
                continue
            tokens, count = self.tokens.pop(id(message)), self.count.pop(id(message))
            copy = after[i + shift] if 0 <= i + shift < len(after) else None
            if copy is not None and copy.get("content") == message.get("content"):
                self.tokens[id(copy)], self.count[id(copy)] = tokens, count
            else:
                self.lost += count


def chat_media(server: Any, messages: Any) -> tuple[Any, TakenImages]:
    """A chat's raw messages with images taken out (`take_images`), or llama-server's error
    for media when the model reads none."""
    projector = server.model.engine.projector
    if not isinstance(messages, list):
        return messages, TakenImages()
    if projector is None:
        refuse_media(messages)
        return messages, TakenImages()
    return take_images(messages, projector, server.settings.media_path)


def image_pins(server: Any, messages: Sequence[Mapping[str, Any]], images: TakenImages) -> Pins:
    pins = Pins(images.hold)
    if not images:
        return pins
    engine = server.model.engine

    def plain(text: str) -> list[int]:
        return list(engine.tokenize(text, add_special=False, parse_special=False))

    for i, tokens in pinned_images(messages, images, engine.projector.marker, plain).items():
        pins.tokens[id(messages[i])] = tokens
        pins.count[id(messages[i])] = len(images[i])
    return pins


def with_images(tokens_of: Callable[..., list[int]], pins: Pins) -> Callable[..., list[int]]:
    """`PromptBuilder.tokens` for a window of the chat, each image in its place (the tokens
    hold the images: `HeldTokens`); a template that does not place a message's text as it is
    cannot place its images (a 400)."""

    def tokens(window: Sequence[Mapping[str, Any]], **options: Any) -> list[int]:
        pinned = {i: pins.tokens[id(m)] for i, m in enumerate(window) if id(m) in pins.tokens}
        out = tokens_of(window, pinned=pinned, **options)
        want = sum(pins.count.get(id(m), 0) for m in window)
        if pins.lost or count_images(out) != want:
            raise ApiError(NOT_PLACED)
        return out if pins.hold is None else HeldTokens(out, pins.hold)

    return tokens


def multimodal_prompt(engine: Any, prompt: Mapping[str, Any]) -> list[int]:
    """llama-server's `{"prompt_string", "multimodal_data"}` prompt: the text (special tokens
    parsed, BOS first) with each media marker replaced by the next image's tokens."""
    projector = engine.projector
    if projector is None:
        raise ApiError(
            "Multimodal data provided, but model does not support multimodal requests.",
            "server_error",
        )
    data = prompt.get("multimodal_data")
    text = prompt.get("prompt_string")
    if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
        raise ApiError('"multimodal_data" must be an array of base64 strings')
    if not isinstance(text, str):
        raise ApiError('"prompt_string" must be a string')
    pieces = text.split(projector.marker)
    if len(pieces) != len(data) + 1:
        raise ApiError(
            f"number of media markers in the prompt ({len(pieces) - 1}) does not match "
            f"number of multimodal_data items ({len(data)})"
        )
    hold = projector.hold()
    tokens = HeldTokens(engine.tokenize(pieces[0], add_special=True, parse_special=True), hold)
    for item, piece in zip(data, pieces[1:], strict=True):
        try:
            tokens += projector.image_tokens(_base64(item), hold=hold)
        except LocalfabError as exc:
            raise ApiError(str(exc)) from exc
        tokens += engine.tokenize(piece, add_special=False, parse_special=True)
    return tokens
