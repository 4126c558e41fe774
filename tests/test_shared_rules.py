"""Rules that several layers apply, each defined once: the reply's room in a fitted chat (the
chat session and the server's chat endpoint) and what a Hugging Face repo id is (catalog, store,
hub)."""

from __future__ import annotations

import pytest

from localfab.catalog import is_repo_id
from localfab.chat.session import reply_room
from localfab.errors import UsageError
from localfab.hub.refs import check_repo


def test_reply_room_is_a_quarter_of_the_context_or_max_tokens_if_less() -> None:
    assert reply_room(4096, 0) == 1024
    assert reply_room(4096, -1) == 1024  # no limit
    assert reply_room(4096, 100) == 100
    assert reply_room(4096, 5000) == 1024
    assert reply_room(4096, 2000, reserve=500) == 500
    assert reply_room(4096, 200, reserve=500) == 200


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("bartowski/Qwen2.5-7B-Instruct-GGUF", True),
        ("a/b", True),
        ("owner", False),
        ("owner/../etc", False),
        ("owner/na..me", False),
        ("-owner/name", False),
        ("owner/name/extra", False),
    ],
)
def test_one_repo_id_rule(text: str, ok: bool) -> None:
    assert is_repo_id(text) is ok
    if ok:
        assert check_repo(text) == text
    else:
        with pytest.raises(UsageError):
            check_repo(text)
