"""Everything that runs the model runs on one thread, whichever thread asks.

llama.cpp computes with OpenMP, which keeps a team of threads per calling thread: a model loaded
on one thread and run from others leaves several teams alive, and decoding slows down (see
`localfab.tui.engine_thread`). These tests hold the app's backend to one engine thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from localfab.chat.history import History
from localfab.tui.backend import ReplyFinished
from localfab.tui.engine_thread import EngineThread
from localfab.tui.local_backend import ChatOptions, LocalBackend
from tests.fake_engine import FakeEngine, fake_loader


def in_thread(fn: Any) -> Any:
    """`fn()` on a new thread (as the app's workers call the backend); its result or raise."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]


def test_calls_and_generator_bodies_run_on_the_one_thread() -> None:
    engine = EngineThread()
    try:
        # Thread objects, not idents: an ended thread's ident can be given to the next one.
        first = in_thread(lambda: engine.call(threading.current_thread))
        second = in_thread(lambda: engine.call(threading.current_thread))

        def threads() -> Iterator[threading.Thread]:
            for _ in range(3):
                yield threading.current_thread()

        streamed = in_thread(lambda: list(engine.stream(threads)))
        assert first is second is streamed[0] is streamed[-1]
        assert first is not threading.current_thread()
        # A call made from the engine thread itself runs at once (no wait on itself).
        assert engine.call(lambda: engine.call(lambda: engine.on_it)) is True
    finally:
        engine.shutdown()


def test_errors_reach_the_caller_and_an_abandoned_stream_is_closed_there() -> None:
    engine = EngineThread()
    closed_on: list[threading.Thread] = []
    try:
        with pytest.raises(ValueError, match="bad model"):
            engine.call(lambda: (_ for _ in ()).throw(ValueError("bad model")))

        def failing() -> Iterator[int]:
            yield 1
            raise RuntimeError("decode failed")

        got: list[int] = []
        with pytest.raises(RuntimeError, match="decode failed"):
            for item in engine.stream(failing):
                got.append(item)
        assert got == [1]

        def endless() -> Iterator[int]:
            try:
                n = 0
                while True:
                    n += 1
                    yield n
            finally:
                closed_on.append(threading.current_thread())

        stream = engine.stream(endless)
        assert next(stream) == 1
        stream.close()
        thread = engine.call(threading.current_thread)  # after the abandoned generator ended
        assert closed_on == [thread]
    finally:
        engine.shutdown()
    # After shutdown, calls still work (inline): a late close never hangs.
    assert engine.call(lambda: 7) == 7


class ThreadWatchingEngine(FakeEngine):
    """A fake engine that notes the thread of every prompt evaluation."""

    def __init__(self) -> None:
        super().__init__(lambda _prompt: "Hello there, from one thread.", delay=0.0)
        self.threads: set[threading.Thread] = set()  # the objects: an ident can be reused

    def evaluate(self, tokens: Sequence[int]) -> int:
        self.threads.add(threading.current_thread())
        return super().evaluate(tokens)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        for item in super().stream(*args, **kwargs):
            self.threads.add(threading.current_thread())
            yield item


def test_the_backend_loads_and_replies_on_one_thread(tmp_path: Any) -> None:
    engine = ThreadWatchingEngine()
    loader = fake_loader(engine, steps=1)
    load_threads: list[threading.Thread] = []

    def watched_loader(progress: Any, cancel: threading.Event) -> Any:
        load_threads.append(threading.current_thread())
        return loader(progress, cancel)

    history = History(tmp_path / "sessions.sqlite3")
    backend = LocalBackend(watched_loader, history, "fake-model", ChatOptions(max_continues=0))
    try:
        in_thread(lambda: backend.load(progress=lambda _p: None, cancel=threading.Event()))
        for text in ("first", "second"):  # each reply from a thread of its own, as in the app
            events = in_thread(lambda t=text: list(backend.send(t, cancel=threading.Event())))
            assert isinstance(events[-1], ReplyFinished)
        assert load_threads and engine.threads
        assert len(set(load_threads) | engine.threads) == 1
    finally:
        backend.close()
        history.close()
    assert engine.closed
