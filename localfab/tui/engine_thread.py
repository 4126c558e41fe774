"""One thread for everything that runs the model: loading it and every reply.

llama.cpp's CPU backend computes with OpenMP, and OpenMP keeps a team of threads for each thread
that calls into it, for as long as that thread lives. The app's workers run on a pool of threads,
so a model loaded on one pool thread and a reply generated on another left two teams alive; with
more OpenMP threads than cores, libgomp stops spinning between a token's parallel regions and
sleeps instead, and decoding ran at 55-75 % of `localfab run`'s speed, depending on which pool
thread a reply happened to get. On one thread there is one team, and the app decodes at
`localfab run`'s speed.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")

_DONE = object()


class _Raised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class EngineThread:
    """Runs calls, and the bodies of generators, on one long-lived thread (started on first use)."""

    def __init__(self, name: str = "localfab-engine") -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=self._started
        )
        self._ident: int | None = None
        self._shut = False

    def _started(self) -> None:
        self._ident = threading.get_ident()

    @property
    def closed(self) -> bool:
        """Whether `shutdown` was called (posted work would run on the caller's thread)."""
        return self._shut

    @property
    def on_it(self) -> bool:
        """Whether the caller is running on the engine thread."""
        return threading.get_ident() == self._ident

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the engine thread; blocks until it returns (or raises)."""
        if self.on_it or self._shut:  # after shutdown the thread has ended: nothing runs beside
            return fn(*args, **kwargs)
        return self._executor.submit(fn, *args, **kwargs).result()

    def post(self, fn: Callable[[], object]) -> None:
        """Run `fn()` on the engine thread, after what is queued, without waiting for it; `fn`
        handles its own errors (what escapes it is lost)."""
        if self._shut:  # the thread has ended: nothing runs beside
            fn()
            return
        self._executor.submit(fn)

    def stream(self, make: Callable[[], Iterator[T]]) -> Iterator[T]:
        """Iterate `make()` on the engine thread, handing its items to the caller as they come.

        If the caller stops early (closes this iterator), the generator is closed on the engine
        thread at its next item.
        """
        if self.on_it or self._shut:
            yield from make()
            return
        items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        abandoned = threading.Event()

        def pump() -> None:
            try:
                source = make()
                try:
                    for item in source:
                        items.put(item)
                        if abandoned.is_set():
                            break
                finally:
                    close = getattr(source, "close", None)
                    if close is not None:
                        close()
            except BaseException as exc:  # handed to the caller, raised there
                items.put(_Raised(exc))
            finally:
                items.put(_DONE)

        self._executor.submit(pump)
        try:
            while (item := items.get()) is not _DONE:
                if isinstance(item, _Raised):
                    raise item.exc
                yield item
        finally:
            abandoned.set()

    def shutdown(self) -> None:
        """Stop taking work; what is queued still runs (the thread ends after it)."""
        self._shut = True
        self._executor.shutdown(wait=False)


def on_engine(
    method: Callable[Concatenate[S, P], T],
) -> Callable[Concatenate[S, P], T]:
    """A method of an object with an `engine_thread` that runs there."""

    @functools.wraps(method)
    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        engine: EngineThread = self.engine_thread  # type: ignore[attr-defined]
        return engine.call(method, self, *args, **kwargs)

    return wrapper


def streamed_on_engine(
    method: Callable[Concatenate[S, P], Iterator[T]],
) -> Callable[Concatenate[S, P], Iterator[T]]:
    """A generator method of an object with an `engine_thread` whose body runs there."""

    @functools.wraps(method)
    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        engine: EngineThread = self.engine_thread  # type: ignore[attr-defined]
        return engine.stream(lambda: method(self, *args, **kwargs))

    return wrapper
