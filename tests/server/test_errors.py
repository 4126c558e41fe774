"""The one exception -> API error mapping the server's endpoints and engine thread share."""

from __future__ import annotations

import json

from localfab.errors import ContextOverflow, LocalfabError, ModelError, UsageError
from localfab.server.errors import ApiError, api_error


def body(err: ApiError) -> dict[str, object]:
    data = json.loads(err.body())
    assert isinstance(data, dict)
    return data


def test_an_api_error_is_itself() -> None:
    err = ApiError("too big", code=413)
    assert api_error(err) is err


def test_a_prompt_past_the_context_is_llama_servers_400_with_both_counts() -> None:
    err = api_error(ContextOverflow(5000, 4096))
    assert err.code == 400
    assert body(err) == {
        "error": {
            "code": 400,
            "message": "request (5000 tokens) exceeds the available context size "
            "(4096 tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 5000,
            "n_ctx": 4096,
        }
    }


def test_a_usage_error_is_a_400_and_other_localfab_errors_a_500() -> None:
    usage = api_error(UsageError("n_probs must be a number"))
    assert (usage.code, usage.type, usage.message) == (
        400,
        "invalid_request_error",
        "n_probs must be a number",
    )
    for exc in (LocalfabError("llama.cpp failed"), ModelError("model file is gone")):
        err = api_error(exc)
        assert (err.code, err.type, err.message) == (500, "server_error", str(exc))


def test_anything_else_is_a_500_naming_its_type_or_what_failed() -> None:
    err = api_error(RuntimeError("boom"))
    assert (err.code, err.type, err.message) == (500, "server_error", "RuntimeError: boom")
    err = api_error(RuntimeError("boom"), failed="generation failed")
    assert err.message == "generation failed: boom"
