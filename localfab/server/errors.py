"""llama-server's error bodies: `{"error": {"code", "message", "type"}}` with HTTP status == code.

The types and codes are llama-server's `format_error_response` (tools/server/server-common.cpp).
"""

from __future__ import annotations

import json
from typing import Any

from localfab.errors import ContextOverflow, LocalfabError, UsageError

# error type -> HTTP status, as llama-server maps them.
ERROR_CODES = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "not_found_error": 404,
    "server_error": 500,
    "permission_error": 403,
    "not_supported_error": 501,
    "unavailable_error": 503,
    "exceed_context_size_error": 400,
}


class ApiError(Exception):
    """An error answer: `type` decides the status unless `code` overrides it (413, 408)."""

    def __init__(
        self, message: str, type_: str = "invalid_request_error", *, code: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.type = type_
        self.code = code if code is not None else ERROR_CODES[type_]
        self.extra: dict[str, Any] = {}

    @classmethod
    def exceed_context(cls, n_prompt_tokens: int, n_ctx: int) -> ApiError:
        """llama-server's 400 for a prompt that does not fit, with both counts."""
        err = cls(
            f"request ({n_prompt_tokens} tokens) exceeds the available context size "
            f"({n_ctx} tokens), try increasing it",
            "exceed_context_size_error",
        )
        err.extra = {"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx}
        return err

    def payload(self) -> dict[str, Any]:
        """The inner error object, in llama-server's key order."""
        return {"code": self.code, "message": self.message, "type": self.type, **self.extra}

    def body(self) -> bytes:
        return dumps({"error": self.payload()})


def api_error(exc: BaseException, *, failed: str | None = None) -> ApiError:
    """The error answer for an exception, the one mapping every endpoint and the engine use.

    An `ApiError` is itself; a prompt past the context is llama-server's 400 with both counts;
    a request that cannot be honoured (`UsageError`) is a 400; any other localfab error a 500
    with its message; anything else a 500 that names what `failed` (else the exception's type).
    """
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflow):
        return ApiError.exceed_context(exc.n_prompt_tokens, exc.n_ctx)
    if isinstance(exc, UsageError):
        return ApiError(str(exc))
    if isinstance(exc, LocalfabError):
        return ApiError(str(exc), "server_error")
    return ApiError(f"{failed or type(exc).__name__}: {exc}", "server_error")


def dumps(data: Any) -> bytes:
    """JSON as llama-server writes it: compact, UTF-8, invalid surrogates replaced."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", errors="replace"
    )
