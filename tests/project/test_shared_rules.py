"""Rules that several layers apply, each defined once: the reply's room in a fitted chat (the
chat session and the server's chat endpoint) and what a Hugging Face repo id is (catalog, store,
hub)."""

from __future__ import annotations

import pytest

from localfab.chat.session import reply_room
from localfab.errors import UsageError
from localfab.hub.refs import check_repo, parse_ref
from localfab.store import safe_repo_dir
from localfab.store.catalog import check_repo_id, is_repo_id


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
        assert check_repo(text) == check_repo_id(text) == text
        assert safe_repo_dir(text) == text.replace("/", "--")
        return
    messages = []
    for check in (check_repo_id, check_repo, safe_repo_dir):
        with pytest.raises(UsageError) as info:
            check(text)
        messages.append(str(info.value))
    # One message, saying what a repo id looks like, whichever layer refused it.
    assert (
        messages
        == [
            f"{text!r} is not a Hugging Face repo id: expected OWNER/NAME, e.g. "
            "bartowski/Qwen2.5-7B-Instruct-GGUF"
        ]
        * 3
    )


def test_a_url_with_a_bad_repo_gets_the_same_message() -> None:
    with pytest.raises(UsageError) as info:
        parse_ref("https://huggingface.co/-owner/name/resolve/main/x-Q4_K_M.gguf")
    assert str(info.value).startswith("'-owner/name' is not a Hugging Face repo id: expected")
