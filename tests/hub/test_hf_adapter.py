"""The adapter over `huggingface_hub` internals (`localfab/hub/_hf.py`) fails here, loudly, when
the library changes, instead of in a user's download."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub  # noqa: F401 - the library reads HF_HUB_OFFLINE once, on import
import pytest

from localfab.hub import _hf
from tests.hf_server import FakeHub

HUB_DIR = Path(__file__).resolve().parents[2] / "localfab" / "hub"
REPO = "owner/Tiny-GGUF"
FILE = "Tiny-Q4_K_M.gguf"


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with FakeHub() as hub:
        yield hub


def test_http_get_still_takes_what_the_adapter_passes() -> None:
    from huggingface_hub.file_download import http_get

    params = inspect.signature(http_get).parameters
    missing = [p for p in _hf.HTTP_GET_PARAMS if p not in params]
    assert not missing, f"huggingface_hub.file_download.http_get lost {missing}: fix _hf.py"
    assert list(params)[:2] == ["url", "temp_file"]
    for name in ("resume_size", "headers", "tqdm_class"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_the_private_helpers_the_adapter_imports_still_exist() -> None:
    from huggingface_hub import get_session, hf_raise_for_status
    from huggingface_hub.utils._headers import build_hf_headers
    from huggingface_hub.utils._http import http_backoff

    assert callable(get_session) and callable(hf_raise_for_status)
    assert "token" in inspect.signature(build_hf_headers).parameters
    # `ranged_get` passes `headers` and `follow_redirects` through to the HTTP client.
    kinds = [p.kind for p in inspect.signature(http_backoff).parameters.values()]
    assert inspect.Parameter.VAR_KEYWORD in kinds
    assert build_hf_headers(token="hf_x")["authorization"] == "Bearer hf_x"
    assert "authorization" not in {k.lower() for k in _hf.auth_headers(False)}


def test_download_resumes_and_reports_bytes(fake: FakeHub, tmp_path: Path) -> None:
    data = bytes(range(256)) * 64
    fake.add_file(REPO, FILE, data=data)
    url = f"{fake.url}/{REPO}/resolve/main/{FILE}"
    target = tmp_path / "part"
    target.write_bytes(data[:1000])
    seen: list[int] = []
    starts: list[int] = []
    with open(target, "ab") as f:
        _hf.download_into(
            url, f, resume=1000, headers={}, on_bytes=seen.append, on_start=starts.append
        )
    assert target.read_bytes() == data
    assert starts == [1000] and sum(seen) == len(data) - 1000
    assert fake.content_gets(FILE)[-1].range == "bytes=1000-"


def test_a_short_body_is_recognised_by_its_type(fake: FakeHub, tmp_path: Path) -> None:
    """`http_get` reports a body of the wrong length as a bare OSError; other errors are not."""
    from huggingface_hub.file_download import http_get

    fake.add_file(REPO, FILE, data=b"GGUF" * 100)
    url = f"{fake.url}/{REPO}/resolve/main/{FILE}"
    with open(tmp_path / "x", "wb") as f, pytest.raises(OSError) as err:
        http_get(url, f, expected_size=401)
    assert _hf.is_short_body(err.value)
    assert not _hf.is_short_body(OSError(28, "No space left on device"))
    assert not _hf.is_short_body(FileNotFoundError("x"))


def test_only_the_adapter_reaches_into_huggingface_hub_internals() -> None:
    """Every other hub module uses the top-level API, `huggingface_hub.errors`, or `_hf`."""
    allowed = {"huggingface_hub", "huggingface_hub.errors"}
    for path in HUB_DIR.glob("*.py"):
        if path.name == "_hf.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("huggingface"):
                assert node.module in allowed, f"{path.name} imports {node.module}"
