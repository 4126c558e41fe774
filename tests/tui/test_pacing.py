"""The frame pacer: streamed text is drawn often, but within a CPU share and after a key's echo."""

from __future__ import annotations

import gc
import weakref

import pytest

from localfab.tui.pacing import (
    SHARED_CORES_MAX_INTERVAL,
    SHARED_CORES_SHARE,
    SPARE_CORE_SHARE,
    FramePacer,
    StreamingGC,
    cpu_share_for,
    max_interval_for,
)


class Clocks:
    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0

    def run(self, wall: float, cpu: float = 0.0) -> None:
        self.wall += wall
        self.cpu += cpu


def pacer(clocks: Clocks, **kw: float) -> FramePacer:
    return FramePacer(clock=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu, **kw)


def test_cheap_updates_are_drawn_every_frame():
    c = Clocks()
    p = pacer(c, min_interval=0.1, cpu_share=0.05)
    p.start()
    assert p.due()  # the first text goes out at once
    p.drawn()
    c.run(0.05, cpu=0.001)
    assert not p.due()  # the minimum interval holds
    c.run(0.05, cpu=0.001)
    assert p.due()
    p.drawn()  # 2 ms of UI CPU in 0.1 s: 2 %, under the 5 % share
    c.run(0.1)
    assert p.due()


def test_costly_updates_wait_in_proportion_to_what_they_cost():
    c = Clocks()
    p = pacer(c, min_interval=0.1, max_interval=0.5, cpu_share=0.05)
    p.start()
    c.run(0.1, cpu=0.015)  # a frame's layout and paint cost 15 ms of UI CPU
    p.drawn()  # so the next waits 15 ms / 5 % = 0.3 s
    c.run(0.25)
    assert not p.due()
    c.run(0.06)
    assert p.due()


def test_the_wait_is_bounded():
    c = Clocks()
    p = pacer(c, min_interval=0.1, max_interval=0.5, cpu_share=0.05)
    p.start()
    c.run(0.1, cpu=1.0)  # a very slow frame
    p.drawn()
    c.run(0.45)
    assert not p.due()
    c.run(0.06)
    assert p.due()


def test_text_waits_after_a_key_but_not_past_the_longest_interval():
    c = Clocks()
    p = pacer(c, min_interval=0.1, max_interval=0.5, cpu_share=0.05, typing_hold=0.06)
    p.start()
    p.drawn()
    c.run(0.2)
    assert p.due()
    p.typed(c.wall - 0.01)  # a key 10 ms ago: its echo is painted first
    assert not p.due()
    c.run(0.06)
    assert p.due()  # the hold is over
    for _ in range(6):  # the user types on, a key every 50 ms
        c.run(0.05)
        p.typed()
    c.run(0.03)
    assert p.due()  # 0.2 + 0.06 + 0.33 s since the last draw: over the longest interval


def test_the_ui_share_is_small_only_when_the_engine_takes_every_core():
    assert cpu_share_for(2, 2) == SHARED_CORES_SHARE  # this kind of machine
    assert cpu_share_for(0, 8) == SHARED_CORES_SHARE  # threads not known: assume it does
    assert cpu_share_for(4, None) == SHARED_CORES_SHARE
    assert cpu_share_for(4, 8) == SPARE_CORE_SHARE > SHARED_CORES_SHARE


def test_objects_from_before_a_reply_sit_out_full_passes_until_it_ends():
    class Node:
        pass

    guard = StreamingGC()
    before = Node()
    guard.begin()
    try:
        assert gc.get_freeze_count() > 0  # `before` and the rest of the process
        cycle = Node()
        cycle.me = cycle  # type: ignore[attr-defined]
        gone = weakref.ref(cycle)
        del cycle
    finally:
        guard.end()
    assert gc.get_freeze_count() == 0
    assert gone() is None  # garbage made while the reply streamed is collected at the end
    assert before is not None


def test_a_short_reply_ends_with_a_pass_over_its_own_objects_and_every_few_with_a_full_one():
    class Node:
        pass

    guard = StreamingGC()
    automatic = gc.isenabled()
    gc.disable()  # only the passes the guard runs
    try:
        old = Node()
        old.me = old  # type: ignore[attr-defined]
        old_gone = weakref.ref(old)
        guard.begin()
        made = Node()
        made.me = made  # type: ignore[attr-defined]
        made_gone = weakref.ref(made)
        del old, made  # both become garbage while the reply streams
        guard.end()
        assert made_gone() is None  # what the reply made goes at once
        assert old_gone() is not None  # the full pass waits: that is what makes the end cheap
        assert gc.get_freeze_count() == 0
        ends = 1
        while old_gone() is not None and ends <= StreamingGC.FULL_EVERY:
            guard.begin()
            guard.end()
            ends += 1
        assert old_gone() is None and ends == StreamingGC.FULL_EVERY + 1
    finally:
        if automatic:
            gc.enable()


def test_an_overdue_draw_still_lets_a_key_just_pressed_echo_first():
    c = Clocks()
    p = pacer(c, min_interval=0.1, max_interval=0.5, cpu_share=0.05)
    p.start()
    p.drawn()
    c.run(0.6)
    p.typed(c.wall - 0.005)
    assert not p.due()  # the echo first
    c.run(0.1)
    assert p.due()
    p.typed(c.wall)
    c.run(0.4)  # twice the longest interval: drawn whatever the keys
    p.typed(c.wall)
    assert p.due()


def test_full_passes_during_a_reply_leave_their_survivors_frozen():
    guard = StreamingGC()
    guard.begin()
    try:
        frozen = gc.get_freeze_count()
        keep = [[i] for i in range(1000)]  # new objects that survive
        gc.collect()  # a full pass, as the collector would run one during the reply
        assert gc.get_freeze_count() >= frozen + len(keep)
    finally:
        guard.end()
    assert gc.get_freeze_count() == 0


def test_a_reply_during_which_a_full_pass_ran_ends_with_a_full_one():
    class Node:
        pass

    guard = StreamingGC()
    automatic = gc.isenabled()
    gc.disable()
    try:
        old = Node()
        old.me = old  # type: ignore[attr-defined]
        old_gone = weakref.ref(old)
        guard.begin()
        del old
        gc.collect()  # a full pass while the reply streams: it cannot see `old`, it is frozen
        assert old_gone() is not None
        guard.end()
        assert old_gone() is None  # the end's pass is a full one
        assert gc.get_freeze_count() == 0
    finally:
        if automatic:
            gc.enable()


def test_wait_says_when_the_next_draw_is_due():
    c = Clocks()
    p = pacer(c, min_interval=0.1, max_interval=0.5, cpu_share=0.05, typing_hold=0.06)
    p.start()
    assert p.wait() == 0.0 and p.due()  # the first text at once
    c.run(0.1, cpu=0.015)
    p.drawn()  # 15 ms of UI CPU at a 5 % share: the next draw in 0.3 s
    assert abs(p.wait() - 0.3) < 1e-5
    c.run(0.29)
    assert not p.due()
    c.run(p.wait())
    assert p.due()
    p.typed(c.wall)  # a key now: text waits for its echo
    assert abs(p.wait() - 0.06) < 1e-5 and not p.due()
    c.run(p.wait())
    assert p.due()


def test_wait_never_passes_the_longest_interval_and_lets_a_key_echo_first():
    c = Clocks()
    p = pacer(c, min_interval=0.1, max_interval=0.5, cpu_share=0.05)
    p.start()
    c.run(0.1, cpu=1.0)  # a very slow frame asks for 20 s
    p.drawn()
    assert abs(p.wait() - 0.5) < 1e-5
    c.run(0.5)
    p.typed(c.wall - 0.005)  # overdue, but a key was just pressed
    assert 0.0 < p.wait() <= 0.015 + 1e-5 and not p.due()
    c.run(p.wait())
    assert p.due()


def test_on_shared_cores_frames_may_wait_longer_so_the_share_holds_on_a_slower_cpu():
    shared, spare = cpu_share_for(2, 2), cpu_share_for(4, 8)
    assert max_interval_for(shared) == SHARED_CORES_MAX_INTERVAL > max_interval_for(spare)
    c = Clocks()
    p = pacer(c, min_interval=0.1, max_interval=max_interval_for(shared), cpu_share=shared)
    p.start()
    c.run(0.1, cpu=0.018)  # an 18 ms frame, as on a slow CPU: 0.72 s at a 2.5 % share
    p.drawn()
    c.run(0.6)
    assert not p.due()  # the old 0.5 s bound would have drawn it, at 3.6 % of a core
    c.run(0.13)
    assert p.due()


def test_a_streaming_reply_wakes_the_screen_for_its_first_text_and_what_is_shown_at_once():
    # On shared cores every wake-up of the UI thread preempts one of the model's threads: text
    # waits for the pacer's tick; only the first event, a shift, the end and a failure wake it.
    # (How often the screen wakes in real time: `scripts/bench.py tui --only wakeups`.)
    from localfab.tui.backend import ReplyText, WindowShifted
    from localfab.tui.reply_stream import STREAM_END, ReplyFailed, ReplyStream

    stream = ReplyStream()
    stream.begin()
    shifted = WindowShifted(turns=1, tokens=10)
    events = [ReplyText("a", 1), ReplyText("b", 1), shifted, ReplyText("c", 1)]
    woke: list[int] = []
    stream.pump(lambda: iter(events), lambda: woke.append(len(stream.inbox)))
    assert woke == [1, 3, 5]  # the first text, the shift, the end
    assert list(stream.inbox) == [*events, STREAM_END] and stream.finished.is_set()

    def failing():
        yield ReplyText("a", 1)
        raise RuntimeError("boom")

    stream = ReplyStream()
    stream.begin()
    woke.clear()
    stream.pump(failing, lambda: woke.append(len(stream.inbox)))
    assert woke == [1, 3]
    assert list(stream.inbox)[1:] == [ReplyFailed("RuntimeError: boom"), STREAM_END]


def test_the_screen_sleeps_until_waiting_text_is_due_and_at_least_a_frame_otherwise():
    from localfab.tui.backend import ReplyText
    from localfab.tui.reply_stream import FRAME_SECONDS, ReplyStream

    clocks = Clocks()
    stream = ReplyStream()
    stream.pacer = pacer(clocks, min_interval=0.4, max_interval=0.4)
    stream.begin()
    assert stream.wait() >= FRAME_SECONDS  # nothing waits: the generating thread wakes it
    stream.inbox.append(ReplyText("a", 1))
    assert stream.take(None) == ["a"]  # the first text is drawn at once
    stream.pacer.drawn()
    stream.inbox.append(ReplyText("b", 1))
    assert stream.take(None) is None  # then text waits for its frame
    assert stream.wait() == pytest.approx(0.4, abs=1e-5)
    clocks.run(0.3)
    assert stream.wait() == pytest.approx(0.1, abs=1e-5)
    clocks.run(0.11)
    assert stream.take(None) == ["b"]
