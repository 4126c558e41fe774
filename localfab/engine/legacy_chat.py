"""llama.cpp's built-in chat templates by name (`--chat-template command-r`), rendered by its own
C++ code (`llama_chat_apply_template`), as llama-server renders a name it knows.

These are fixed formats written in C++ for ~50 model families; they take role and text only
(no tools), which is what llama.cpp's legacy route gives them too.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

from localfab.errors import UsageError


@functools.cache
def builtin_names() -> frozenset[str]:
    """The template names llama.cpp knows (llama_chat_builtin_templates)."""
    import llama_cpp as lc

    count = lc.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * max(count, 0))()
    lc.llama_chat_builtin_templates(names, count)
    return frozenset(n.decode() for n in names if n)


def render(name: str, messages: Sequence[tuple[str, str]], add_generation_prompt: bool) -> str:
    """The conversation (role, text) in the built-in format `name`, as llama.cpp writes it."""
    import llama_cpp as lc

    if name not in builtin_names():
        raise UsageError(f"{name!r} is not one of llama.cpp's built-in chat templates")
    chat = (lc.llama_chat_message * max(len(messages), 1))()
    keep = []  # the encoded texts must outlive the call
    for i, (role, text) in enumerate(messages):
        pair = (role.encode(), text.encode())
        keep.append(pair)
        chat[i].role, chat[i].content = pair
    size = 256 + 2 * sum(len(r) + len(t) for r, t in keep)
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = lc.llama_chat_apply_template(
            name.encode(), chat, len(messages), add_generation_prompt, buf, size
        )
        if n < 0:
            raise UsageError(f"llama.cpp's {name!r} chat template cannot render these messages")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n
    raise UsageError(f"llama.cpp's {name!r} chat template did not render")
