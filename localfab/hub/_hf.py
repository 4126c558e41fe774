"""The one place localfab leans on `huggingface_hub` beyond its top-level public API.

Resuming needs the library's `file_download.http_get`: since 2.x `hf_hub_download` writes to a
process-unique temporary file and deletes it on failure, so an interrupted download would restart
from zero. `http_get` takes an open file and `resume_size`, sends `Range: bytes=N-`, retries
dropped connections itself and reports bytes through a tqdm-like class. It is not part of the
documented API, so everything it needs is here, and `tests/hub/test_hf_adapter.py` checks its
signature: a library change fails that test instead of a user's download.

The helpers from `huggingface_hub.utils` (auth headers, the shared HTTP session, backoff, error
mapping) are documented utilities; they are wrapped here too so the rest of `localfab.hub` only
sees plain functions and the public `huggingface_hub.errors` types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO, cast

if TYPE_CHECKING:
    import httpx2

# The parameters of `http_get` that `download_into` passes; checked by the adapter test.
HTTP_GET_PARAMS = ("url", "temp_file", "resume_size", "headers", "tqdm_class")


def auth_headers(token: str | bool | None) -> dict[str, str]:
    """The headers huggingface_hub sends (user agent, `authorization` when there is a token)."""
    from huggingface_hub.utils._headers import build_hf_headers

    return build_hf_headers(token=token)


def network_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the network failed", not "the hub said no"."""
    import httpx2

    return (httpx2.HTTPError, ConnectionError, TimeoutError)


def download_into(
    url: str,
    file: BinaryIO,
    *,
    resume: int,
    headers: Mapping[str, str],
    on_bytes: Callable[[int], None],
    on_start: Callable[[int], None],
) -> None:
    """GET `url` from byte `resume` on, appending to `file`; `on_bytes(n)` as chunks arrive.

    The library retries dropped connections from where they stopped. It is not told the size
    to expect: the caller compares what arrived with what the hub advertised.
    """
    from huggingface_hub.file_download import http_get

    http_get(
        url,
        file,
        resume_size=resume,
        headers=dict(headers),
        tqdm_class=cast(Any, _bar_class(on_bytes, on_start)),
    )


def _bar_class(on_bytes: Callable[[int], None], on_start: Callable[[int], None]) -> type:
    """A tqdm stand-in for `http_get(tqdm_class=...)` that forwards byte counts."""

    class _Bar:
        def __init__(self, *args: Any, initial: int = 0, **kwargs: Any) -> None:
            on_start(initial)

        def update(self, n: float | None = 1) -> None:
            on_bytes(int(n or 0))

        def close(self) -> None:
            pass

        def __enter__(self) -> _Bar:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    return _Bar


def ranged_get(url: str, headers: Mapping[str, str]) -> httpx2.Response:
    """One GET with the library's backoff on transient failures (redirects followed).

    Raises the library's `HfHubHTTPError` family for error statuses other than 416 (a range
    past the end, which the caller treats as "nothing there").
    """
    from huggingface_hub import hf_raise_for_status
    from huggingface_hub.utils._http import http_backoff

    response = http_backoff("GET", url, headers=dict(headers), follow_redirects=True)
    if response.status_code != 416:
        hf_raise_for_status(response)
    return response


def has_byte_at(url: str, headers: Mapping[str, str], offset: int) -> bool:
    """Whether the server has a byte at `offset` (a one-byte ranged GET)."""
    from huggingface_hub import get_session

    probe = {**headers, "Range": f"bytes={offset}-{offset}"}
    with get_session().stream("GET", url, headers=probe, follow_redirects=True) as r:
        if r.status_code == 206:
            return True
        length = r.headers.get("Content-Length", "")
        return r.status_code == 200 and length.isdigit() and int(length) > offset


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a `huggingface_hub` HTTP error (`HfHubHTTPError.response`), or None."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return exc.response.status_code
    return None


def is_short_body(exc: BaseException) -> bool:
    """Whether `http_get` gave up because the body's length differed from the size it expected.

    It raises a bare `OSError` with no errno for that ("Consistency check failed"); disk errors
    carry an errno, and HTTP errors are `HfHubHTTPError`. Told apart by type, not by message.
    """
    return type(exc) is OSError and exc.errno is None
