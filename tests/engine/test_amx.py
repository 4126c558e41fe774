"""A llama.cpp build with its AMX kernels (which crash this version) loads without extra buffers,
and says once how to rebuild it; any other build loads as asked."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from localfab.engine import native


@pytest.fixture()
def build(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, bool]]:
    state = {"amx": False}
    monkeypatch.setattr(native, "amx_in_build", lambda: state["amx"])
    native._say_amx.cache_clear()
    yield state
    native._say_amx.cache_clear()


def test_without_amx_the_weights_load_as_asked(
    build: dict[str, bool], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="localfab.engine"):
        assert native.extra_buffers(True) is True
        assert native.extra_buffers(False) is False
    assert not caplog.records


def test_with_amx_extra_buffers_are_off_and_the_fix_is_said_once(
    build: dict[str, bool], caplog: pytest.LogCaptureFixture
) -> None:
    build["amx"] = True
    with caplog.at_level(logging.WARNING, logger="localfab.engine"):
        assert native.extra_buffers(True) is False
        assert native.extra_buffers(True) is False
        assert native.extra_buffers(False) is False
    [record] = caplog.records
    text = record.getMessage()
    assert "AMX" in text and "-mno-amx-tile" in text and "--no-cache-dir" in text
    assert "llama-cpp-python==" in text and "{version}" not in text


@pytest.mark.parametrize(
    ("report", "amx"),
    [
        ("CPU : SSE3 = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | REPACK = 1 | ", True),
        ("CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | LLAMAFILE = 1 | REPACK = 1 | ", False),
        ("", False),
    ],
)
def test_amx_is_read_from_llama_cpps_own_report(
    monkeypatch: pytest.MonkeyPatch, report: str, amx: bool
) -> None:
    monkeypatch.setattr(native.lc, "llama_print_system_info", lambda: report.encode())
    native.amx_in_build.cache_clear()
    try:
        assert native.amx_in_build() is amx
    finally:
        native.amx_in_build.cache_clear()
