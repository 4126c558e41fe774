"""The test tiers: no test that loads the real model runs in the `-m "not model"` loop."""

from __future__ import annotations

import pytest

from tests.conftest import MODEL_FIXTURES


def test_every_collected_test_that_loads_the_model_is_marked(request: pytest.FixtureRequest):
    """Whatever `-m` selected: a test using the model fixtures carries `model`.

    Under `-m "not model"` this means no such test was selected at all.
    """
    unmarked = [
        item.nodeid
        for item in request.session.items
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("model") is None
    ]
    assert unmarked == []
    if "not model" in (request.config.getoption("markexpr") or ""):
        users = [
            item.nodeid
            for item in request.session.items
            if MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        ]
        assert users == []


def test_the_tier_markers_are_registered(request: pytest.FixtureRequest):
    names = {line.split(":")[0].strip() for line in request.config.getini("markers")}
    assert {"model", "slow"} <= names
