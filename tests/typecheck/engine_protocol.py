"""Checked by mypy --strict with the package (`[tool.mypy] files` in pyproject.toml), not run.

`ChatSession` types its engine as `ChatEngine`: both engines it is given must fit it. The wrong
one keeps the check honest: strict mode reports an ignore that is no longer needed, so if the
protocol stopped rejecting an int, mypy would fail here.
"""

from localfab.engine import ChatEngine, Engine
from tests.fake_engine import FakeEngine


def real(e: Engine) -> ChatEngine:
    return e


def fake(e: FakeEngine) -> ChatEngine:
    return e


def wrong(e: int) -> ChatEngine:
    return e  # type: ignore[return-value]
