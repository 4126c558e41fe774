"""llama.cpp's load progress reaches the caller, and a load can be stopped part-way."""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab.engine import Engine, EngineSettings
from localfab.errors import LoadCancelled, LocalfabError
from localfab.runtime import load_model

SETTINGS = EngineSettings(n_ctx=512, n_batch=128, warmup=False)


def test_progress_rises_to_one_and_never_goes_back(model_path: Path) -> None:
    seen: list[float] = []

    def progress(fraction: float) -> bool:
        seen.append(fraction)
        return True

    with Engine(model_path, SETTINGS, progress=progress) as eng:
        assert eng.tokenize("hello")
    assert len(seen) > 2  # one call per tensor, not just the start and the end
    assert seen == sorted(seen)
    assert seen[-1] == 1.0
    assert all(0.0 <= f <= 1.0 for f in seen)


def test_returning_false_stops_the_load_and_a_new_load_works(model_path: Path) -> None:
    seen: list[float] = []

    def stop_halfway(fraction: float) -> bool:
        seen.append(fraction)
        return fraction < 0.5

    with pytest.raises(LoadCancelled) as caught:
        Engine(model_path, SETTINGS, progress=stop_halfway)
    assert isinstance(caught.value, LocalfabError)
    assert seen[-1] >= 0.5 and seen[-1] < 1.0  # stopped mid-way, not after the load finished
    calls = len(seen)
    # The same model loads again afterwards, and the stopped load's callback is not called again.
    with Engine(model_path, SETTINGS) as eng:
        assert eng.tokenize("hello")
    assert len(seen) == calls


def test_an_error_in_the_callback_stops_the_load_and_is_raised(model_path: Path) -> None:
    def broken(fraction: float) -> bool:
        raise ValueError("progress display went away")

    with pytest.raises(ValueError, match="display went away"):
        Engine(model_path, SETTINGS, progress=broken)


def test_load_model_passes_progress_through(model_path: Path) -> None:
    seen: list[float] = []
    loaded = load_model(model_path, SETTINGS, progress=lambda f: seen.append(f) is None)
    try:
        assert seen and seen[-1] == 1.0
    finally:
        loaded.close()
    with pytest.raises(LoadCancelled):
        load_model(model_path, SETTINGS, progress=lambda f: False)


def test_the_app_loader_reports_fractions_and_a_cancel_stops_the_weights(
    model_path: Path, tmp_path: Path
) -> None:
    import threading

    from localfab.config import Config, default_paths
    from localfab.tui.backend import LoadProgress
    from localfab.tui.model_loader import WEIGHTS_END, WEIGHTS_START, model_loader

    paths = default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})
    loader = model_loader(str(model_path), paths, Config(), ctx_size=512)
    steps: list[LoadProgress] = []
    loaded = loader(steps.append, threading.Event())
    try:
        weights = [s.fraction for s in steps if s.stage == "loading weights"]
        assert len(weights) > 3 and weights == sorted(weights)
        assert weights[-1] == pytest.approx(WEIGHTS_END)
        assert steps[-1].stage == "ready" and steps[-1].fraction == 1.0
    finally:
        loaded.close()

    cancel = threading.Event()
    seen: list[LoadProgress] = []

    def progress(step: LoadProgress) -> None:
        seen.append(step)
        if step.stage == "loading weights" and (step.fraction or 0) > 0.3:
            cancel.set()  # the user pressed "Cancel load" while the weights were loading

    with pytest.raises(LoadCancelled):
        loader(progress, cancel)
    fractions = [s.fraction or 0 for s in seen if s.stage == "loading weights"]
    assert WEIGHTS_START < fractions[-1] < WEIGHTS_END
    assert all(s.stage != "ready" for s in seen)
