"""A user message with images, for a model with a vision projector (`engine.vision`).

The message's text gets the projector's media marker once per image, each on a line of its
own before the text (as llama.cpp's mtmd tools put an image they are given before the prompt);
its tokens, pinned where the chat template places that text, hold each image's tokens in its
marker's place. A template that does not place a message's text as it is cannot place images:
the caller checks the prompt (`count_images`) and says so (`NOT_PLACED`) instead of sending a
prompt without them.

With a history, a message's images are stored with it (`history_images`), and a resumed chat
gets them back in its prompt (`restore_images`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from localfab.chat.history_images import Attachment, refs_from, refs_json
from localfab.engine.image_ids import index_in_image
from localfab.errors import LocalfabError, UsageError

if TYPE_CHECKING:
    from localfab.chat.history import History
    from localfab.chat.history_schema import StoredMessage


def image_message(
    text: str, images: Sequence[bytes], engine: Any, tokenize: Callable[[str], list[int]]
) -> tuple[str, list[int]]:
    """The message's content and its tokens: where `text` names the images by the projector's
    marker (`<__media__>`, once per image, as llama.cpp's mtmd tools take a prompt), each image
    in its marker's place; otherwise the markers, one per line, then `text`. A LocalfabError,
    in one line, when the model reads no images, one is bad, or the markers do not match."""
    projector = getattr(engine, "projector", None)
    if projector is None:
        raise UsageError("this model reads no images: give its vision projector (--mmproj FILE)")
    marker = projector.marker
    if marker in text:
        pieces = text.split(marker)
        if len(pieces) - 1 != len(images):
            raise UsageError(
                f"the prompt names {len(pieces) - 1} image(s) ({marker}) but {len(images)} "
                "were given: one image per marker, in order"
            )
        tokens: list[int] = []
        for piece, data in zip(pieces, images, strict=False):
            tokens += (tokenize(piece) if piece else []) + projector.image_tokens(data)
        return text, tokens + (tokenize(pieces[-1]) if pieces[-1] else [])
    content, tokens = "", []
    newline = tokenize("\n")
    for data in images:
        tokens += projector.image_tokens(data) + newline
        content += marker + "\n"
    return content + text, tokens + tokenize(text)


NOT_PLACED = (
    "this model's chat template does not place a message's text as it is, so the images "
    "cannot be placed in it"
)


def count_images(tokens: Sequence[int]) -> int:
    """How many images a prompt holds."""
    return sum(t < 0 and index_in_image(t) == 0 for t in tokens)


def store_images(history: History | None, images: Sequence[Attachment]) -> str:
    """The images put in the history's store, as its message names them ("" for none)."""
    if history is None or not images:
        return ""
    return refs_json([history.images.put(image) for image in images])


def stored_images(history: History | None, message_id: int | None) -> list[Attachment]:
    """The images a stored message carried (those whose files are still there)."""
    if history is None or message_id is None:
        return []
    found = history.siblings(message_id)
    message = next((m for m in found if m.id == message_id), None)
    refs = refs_from(message.images) if message is not None else []
    return [Attachment(data, r.name) for r in refs if (data := history.images.get(r)) is not None]


def restore_images(
    stored: Sequence[StoredMessage],
    messages: list[dict[str, Any]],
    pins: dict[int, tuple[str, tuple[int, ...]]],
    engine: Any,
    tokenize: Callable[[str], list[int]],
    history: History,
) -> None:
    """Give a resumed chat's messages their images back (markers in the text, the images'
    tokens pinned), where the model reads images; otherwise they stay text."""
    if getattr(engine, "projector", None) is None:
        return
    for i, m in enumerate(stored):
        if m.role != "user" or not m.images:
            continue
        images = [d for r in refs_from(m.images) if (d := history.images.get(r)) is not None]
        if not images:
            continue
        try:
            content, pinned = image_message(m.content, images, engine, tokenize)
        except LocalfabError:  # an image gone from the store: the message stays text
            continue
        messages[i]["content"] = content
        pins[i] = (content, tuple(pinned))
