"""A user message with images, for a model with a vision projector (`engine.vision`).

The message's text gets the projector's media marker once per image, each on a line of its
own before the text (as llama.cpp's mtmd tools put an image they are given before the prompt);
its tokens, pinned where the chat template places that text, hold each image's tokens in its
marker's place. A template that does not place a message's text as it is cannot place images:
the caller checks the prompt (`count_images`) and says so (`NOT_PLACED`) instead of sending a
prompt without them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from localfab.engine.image_ids import index_in_image
from localfab.errors import UsageError


def image_message(
    text: str, images: Sequence[bytes], engine: Any, tokenize: Callable[[str], list[int]]
) -> tuple[str, list[int]]:
    """The message's content (markers, then `text`) and its tokens (each image's, then the
    text's as plain text). A LocalfabError, in one line, when the model reads no images or
    one is bad."""
    projector = getattr(engine, "projector", None)
    if projector is None:
        raise UsageError("this model reads no images: give its vision projector (--mmproj FILE)")
    content, tokens = "", []
    newline = tokenize("\n")
    for data in images:
        tokens += projector.image_tokens(data) + newline
        content += projector.marker + "\n"
    return content + text, tokens + tokenize(text)


NOT_PLACED = (
    "this model's chat template does not place a message's text as it is, so the images "
    "cannot be placed in it"
)


def count_images(tokens: Sequence[int]) -> int:
    """How many images a prompt holds."""
    return sum(t < 0 and index_in_image(t) == 0 for t in tokens)
