"""A Ctrl-C that arrives while llama.cpp's log callback runs is not lost.

ctypes drops any exception raised inside a callback, so a KeyboardInterrupt raised there (the
signal handler runs wherever Python happens to be) would vanish and `localfab run` would go on
generating. The callback has the interrupt signalled again once it has returned.
"""

from __future__ import annotations

import ctypes
import logging
import time

import pytest

from localfab.engine import native


class _InterruptOnce(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.fired = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt


def test_ctrl_c_inside_the_log_callback_reaches_the_main_thread() -> None:
    handler = _InterruptOnce()
    native.llama_log.addHandler(handler)
    old_level = native.llama_log.level
    native.llama_log.setLevel(logging.DEBUG)
    try:
        with pytest.raises(KeyboardInterrupt):
            # Called through ctypes, as llama.cpp calls it; the line ends, so it is logged.
            native._on_log(3, b"a warning from llama.cpp\n", ctypes.c_void_p(0))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # raised here, once the callback has returned
                time.sleep(0.001)
        assert handler.fired
    finally:
        native.llama_log.removeHandler(handler)
        native.llama_log.setLevel(old_level)
    assert "a warning from llama.cpp" in native.log_since(0)
