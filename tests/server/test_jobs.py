"""Per-token timings (`timings_per_token`) and the final timings of the same reply agree: the
final predicted_ms is never below the last per-token one, though the engine takes the final
figure and the engine thread the per-token ones (on parallel slots a step's tokens reach that
thread together, a little after they were sampled)."""

from __future__ import annotations

import time
from typing import Any

from localfab.engine import Done, SamplingParams, TokenEvent
from localfab.engine.types import GenerationOptions, Timings
from localfab.server.jobs import Job, JobRun, SlotView, Step


def test_the_final_predicted_ms_is_never_below_the_last_per_token_figure() -> None:
    sent: list[Any] = []
    options = GenerationOptions(max_tokens=5, sampling=SamplingParams.greedy())
    job = Job(1, [1, 2, 3], options, sent.append, timings_per_token=True)
    run = JobRun(job, [])
    view = SlotView()
    run.on_token(TokenEvent(10, "a"), view)
    time.sleep(0.01)
    run.on_token(TokenEvent(11, "b"), view)
    last = sent[-1]
    assert isinstance(last, Step) and last.timings is not None
    live = last.timings.predicted_ms
    assert live >= 10
    # The engine's own clock saw the two tokens closer together than the thread did.
    engine = Done(
        "ab", "length", "limit", (10, 11), Timings(predicted_n=2, predicted_ms=live / 2), 3
    )
    final = run.finish(engine)
    assert final.timings.predicted_ms == live
    # A later final figure is kept as it is.
    later = Done(
        "ab", "length", "limit", (10, 11), Timings(predicted_n=2, predicted_ms=live + 5), 3
    )
    assert run.finish(later).timings.predicted_ms == live + 5
