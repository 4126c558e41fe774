"""The models the app can open: local models with their size, quant and fit on this machine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from localfab.config import Paths


@dataclass(frozen=True)
class ModelRow:
    """One local model as the models screen lists it."""

    name: str
    size: str
    quant: str
    arch: str
    last_used: str
    path: Path | None = None


class ModelSource(Protocol):
    """Where the models screen gets its rows and fit verdicts (a fake in tests)."""

    def rows(self) -> list[ModelRow]: ...

    def fit(self, row: ModelRow) -> str | None:
        """The planner's short verdict ("GPU 8k", "CPU 8k", "too big"); slow: call in a worker."""
        ...


class LocalModels:
    """Registered and built-in models from the store, judged by the planner."""

    def __init__(self, paths: Paths) -> None:
        from localfab.commands.models import FitJudge

        self.paths = paths
        self._judge = FitJudge()

    def rows(self) -> list[ModelRow]:
        from localfab.commands.models import human_age, human_size
        from localfab.store import Store

        out = []
        for e in Store(self.paths).list():
            size = human_size(e.size) if e.present else "missing"
            if e.source == "embedded" and not e.present:
                size = "built in"
            out.append(
                ModelRow(
                    name=e.name,
                    size=size,
                    quant=e.quant or "-",
                    arch=e.arch or "-",
                    last_used=human_age(e.last_used),
                    path=e.path if e.present else None,
                )
            )
        return out

    def fit(self, row: ModelRow) -> str | None:
        if row.path is None:
            return None
        return self._judge(row.path)
