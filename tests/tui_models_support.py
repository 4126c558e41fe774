"""A fake `ModelSource` + `ModelActions` for the models screen's pilot and snapshot tests.

The download queue is the real `PullQueue`; only the hub and the store are faked. Pulls report
fixed progress and wait on events the test sets, so a test decides when a download moves on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from localfab.errors import HubError, ModelNotFound
from localfab.hub import DownloadProgress
from localfab.store.catalog import load_catalog
from localfab.tui.downloads import PullCancelled, PullQueue
from localfab.tui.models import CatalogRow, ModelRow, catalog_row

MiB = 1 << 20
GATED_ERROR = (
    "meta-llama/Llama-3.2-1B is a gated model (HTTP 401): accept its licence at "
    "https://huggingface.co/meta-llama/Llama-3.2-1B, create a read token at "
    "https://huggingface.co/settings/tokens and set HF_TOKEN (or pass --token)"
)


class FakePull:
    """One scripted download: how far it gets before it waits, and how it ends."""

    def __init__(self, *, total: int = 400 * MiB, fail: str | None = None) -> None:
        self.total = total
        self.fail = fail
        self.release = threading.Event()  # set: the download completes (or fails)
        self.started = threading.Event()


class FakeModels:
    """Two local models and the first catalog entries; verdicts and pulls as the test says."""

    def __init__(self) -> None:
        self.local = [
            ModelRow("small", "241.4 MiB", "Q4_K_M", "gemma3", "just now"),
            ModelRow("big", "4.07 GiB", "Q4_K_M", "llama", "never"),
        ]
        self.verdicts = {"small": "CPU 8k", "big": "too big"}
        entries = list(load_catalog())[:5]
        self.entries = [catalog_row(c) for c in entries]
        # the second entry has 10 MiB of an earlier, interrupted download
        self.entries[1] = catalog_row(entries[1], kept=10 * MiB)
        self.remote: dict[str, str | Exception] = {
            e.name: v
            for e, v in zip(
                self.entries, ["CPU 32k", "GPU 32k", "GPU 8k", "too big", ""], strict=True
            )
        }
        self.remote[self.entries[4].name] = HubError(GATED_ERROR)
        self.fits_gate = threading.Event()
        self.fits_gate.set()  # clear it to keep the catalog at "checking…"
        self.pulls: dict[str, FakePull] = {}
        self.pulled: list[str] = []
        self.removed: list[str] = []
        self.queue = PullQueue(self.pull)

    # ModelSource --------------------------------------------------------------------------------
    def rows(self) -> list[ModelRow]:
        return list(self.local)

    def fit(self, row: ModelRow) -> str | None:
        return self.verdicts.get(row.name)

    # ModelActions -------------------------------------------------------------------------------
    @property
    def downloads(self) -> PullQueue:
        return self.queue

    def catalog(self) -> list[CatalogRow]:
        here = {r.name for r in self.local}
        return [
            CatalogRow(**{**e.__dict__, "local": e.name if e.name in here else None})
            for e in self.entries
        ]

    def remote_fit(self, row: CatalogRow) -> str:
        self.fits_gate.wait(10)
        verdict = self.remote[row.name]
        if isinstance(verdict, Exception):
            raise verdict
        return verdict

    def script(self, name: str, **kwargs: object) -> FakePull:
        self.pulls[name] = FakePull(**kwargs)  # type: ignore[arg-type]
        return self.pulls[name]

    def pull(
        self, name: str, progress: Callable[[DownloadProgress], None], cancel: threading.Event
    ) -> str:
        plan = self.pulls.setdefault(name, FakePull())
        plan.started.set()
        half = plan.total * 3 // 8
        progress(
            DownloadProgress(
                file=f"{name}.gguf",
                file_index=0,
                file_count=1,
                done=half,
                total=plan.total,
                speed=12.5 * MiB,
                eta=(plan.total - half) / (12.5 * MiB),
                resumed=0,
            )
        )
        while not plan.release.wait(0.02):
            if cancel.is_set():
                raise PullCancelled(f"the download of {name} was cancelled")
        if plan.fail:
            raise HubError(plan.fail)
        self.pulled.append(name)
        self.local.append(ModelRow(name, "397.8 MiB", "Q4_K_M", "qwen2", "never"))
        return f"pulled {name}: 397.8 MiB (sha256 verified)"

    def removal_question(self, name: str) -> str:
        return f"Remove {name} and delete its files?"

    def remove(self, name: str) -> str:
        row = next((r for r in self.local if r.name == name), None)
        if row is None:
            raise ModelNotFound(f"no model called {name!r} is registered")
        self.local.remove(row)
        self.removed.append(name)
        return f"removed {name}, freed {row.size}"

    def release_all(self) -> None:
        for plan in self.pulls.values():
            plan.release.set()
