"""The download queue behind the models screen: one pull at a time, cancel, failures, progress
lines. Plain threads, no terminal."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from localfab.errors import HubError, UsageError
from localfab.hub import DownloadProgress
from localfab.tui.downloads import PullCancelled, PullJob, PullQueue, describe
from localfab.units import format_duration as duration

MiB = 1 << 20


def progress(done: int, total: int | None = 100 * MiB, **kw: object) -> DownloadProgress:
    fields: dict[str, object] = {
        "file": "m.gguf",
        "file_index": 0,
        "file_count": 1,
        "done": done,
        "total": total,
        "speed": 2 * MiB,
        "eta": 30.0,
        "resumed": 0,
    }
    fields.update(kw)
    return DownloadProgress(**fields)  # type: ignore[arg-type]


class Script:
    """Pulls that report progress and wait for the test to release them."""

    def __init__(self) -> None:
        self.release: dict[str, threading.Event] = {}
        self.started: list[str] = []
        self.running = 0
        self.most_at_once = 0
        self.outcome: dict[str, Exception] = {}
        self.lock = threading.Lock()

    def gate(self, name: str) -> threading.Event:
        return self.release.setdefault(name, threading.Event())

    def __call__(
        self, name: str, report: Callable[[DownloadProgress], None], cancel: threading.Event
    ) -> str:
        with self.lock:
            self.started.append(name)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            report(progress(10 * MiB))
            while not self.gate(name).wait(0.01):
                report(progress(20 * MiB))  # the queue raises here once cancelled
            if name in self.outcome:
                raise self.outcome[name]
            return f"pulled {name}"
        finally:
            with self.lock:
                self.running -= 1


def wait_until(condition: Callable[[], bool], seconds: float = 10) -> None:
    done = threading.Event()
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("timed out")


def states(queue: PullQueue) -> list[tuple[str, str]]:
    return [(j.name, j.state) for j in queue.jobs()]


def test_pulls_run_one_at_a_time_in_order() -> None:
    script = Script()
    queue = PullQueue(script)
    seen: list[PullJob] = []
    queue.subscribe(seen.append)
    for name in ("a", "b", "c"):
        queue.add(name)
    wait_until(lambda: script.started == ["a"])
    assert states(queue) == [("a", "running"), ("b", "queued"), ("c", "queued")]
    script.gate("a").set()
    wait_until(lambda: script.started == ["a", "b"])
    script.gate("b").set()
    script.gate("c").set()
    assert queue.wait_idle(10)
    assert states(queue) == [("a", "done"), ("b", "done"), ("c", "done")]
    assert script.most_at_once == 1
    assert [j.message for j in queue.jobs()] == ["pulled a", "pulled b", "pulled c"]
    # listeners saw each job queued, running with progress, and done
    a = [j for j in seen if j.name == "a"]
    assert a[0].state == "queued" and a[-1].state == "done"
    assert any(j.progress is not None and j.progress.done == 10 * MiB for j in a)


def test_the_same_model_cannot_be_queued_twice_until_it_ends() -> None:
    script = Script()
    queue = PullQueue(script)
    queue.add("a")
    with pytest.raises(UsageError, match="already downloading or queued"):
        queue.add("a")
    script.gate("a").set()
    assert queue.wait_idle(10)
    queue.add("a")  # again after it ended: allowed (an already-present pull says so)
    assert queue.wait_idle(10)
    assert states(queue) == [("a", "done"), ("a", "done")]


def test_cancel_drops_a_queued_pull_and_stops_a_running_one_keeping_its_bytes() -> None:
    script = Script()
    queue = PullQueue(script)
    queue.add("a")
    queue.add("b")
    wait_until(lambda: (j := queue.active("a")) is not None and j.progress == progress(20 * MiB))
    assert queue.cancel("b")
    assert queue.active("b") is None
    assert queue.cancel("a")
    assert queue.wait_idle(10)
    assert states(queue) == [("a", "cancelled"), ("b", "cancelled")]
    assert script.started == ["a"]  # b never ran
    a, b = queue.jobs()
    assert a.message == "cancelled: 20.0 MiB kept, pull again to resume"
    assert b.message == "cancelled before it started"
    assert not queue.cancel("a")  # nothing left to cancel


def test_a_failure_is_reported_and_the_queue_goes_on() -> None:
    script = Script()
    script.outcome["a"] = HubError("a is a gated model (HTTP 401): set HF_TOKEN")
    script.outcome["b"] = RuntimeError("boom")
    queue = PullQueue(script)
    for name in ("a", "b", "c"):
        script.gate(name).set()
        queue.add(name)
    assert queue.wait_idle(10)
    assert states(queue) == [("a", "failed"), ("b", "failed"), ("c", "done")]
    a, b, _ = queue.jobs()
    assert a.message == "a is a gated model (HTTP 401): set HF_TOKEN"
    assert b.message == "download of b failed (RuntimeError: boom)"
    queue.clear_finished()
    assert queue.jobs() == []


def test_unsubscribed_listeners_hear_nothing_more() -> None:
    script = Script()
    queue = PullQueue(script)
    heard: list[str] = []
    stop = queue.subscribe(lambda job: heard.append(job.state))
    stop()
    script.gate("a").set()
    queue.add("a")
    assert queue.wait_idle(10)
    assert heard == []


def test_progress_lines() -> None:
    job = PullJob(1, "m", "running", progress(25 * MiB, speed=5 * MiB, eta=15.0))
    assert describe(job) == "25.0 MiB / 100.0 MiB · 5.0 MiB/s · 15s left"
    resumed = PullJob(1, "m", "running", progress(60 * MiB, eta=200.0, resumed=50 * MiB))
    assert describe(resumed) == (
        "60.0 MiB / 100.0 MiB · 2.0 MiB/s · 3m20s left · resumed at 50.0 MiB"
    )
    split = PullJob(1, "m", "running", progress(1 * MiB, file_index=1, file_count=3, speed=0))
    assert describe(split) == "part 2/3 · 1.0 MiB / 100.0 MiB · -- /s · 30s left"
    verify = PullJob(1, "m", "running", progress(40 * MiB, stage="verify"))
    assert describe(verify) == "checking sha256 · 40.0 MiB / 100.0 MiB"
    wait = PullJob(1, "m", "running", progress(0, stage="wait"))
    assert "another localfab is downloading" in describe(wait)
    assert describe(PullJob(1, "m")) == "queued"
    assert describe(PullJob(1, "m", "failed", message="no space")) == "no space"
    assert duration(None) == "--" and duration(3725) == "1h02m"


def test_a_pull_func_that_raises_pull_cancelled_itself_counts_as_cancelled() -> None:
    def pull(name: str, report: Callable[[DownloadProgress], None], cancel: threading.Event) -> str:
        raise PullCancelled("stopped")

    queue = PullQueue(pull)
    queue.add("a")
    assert queue.wait_idle(10)
    assert states(queue) == [("a", "cancelled")]
    assert queue.jobs()[0].message == "cancelled"
