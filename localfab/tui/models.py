"""The models the app can open and get: local models with their fit, the curated catalog, pulls.

The models screen talks to two small interfaces: `ModelSource` (the local list and its fit
verdicts) and `ModelActions` (the catalog, fit before download, pulls, removal). `LocalModels`
implements both on the real store and hub; tests give the screen fakes. Nothing here imports
textual, and the hub, the planner and the GGUF reader are imported only when first used.
"""

from __future__ import annotations

import glob
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from localfab.config import Paths
from localfab.errors import LocalfabError
from localfab.remote.listing import RemoteRow, remote_rows
from localfab.tui.downloads import PullCancelled, PullQueue
from localfab.units import format_bytes, format_context

if TYPE_CHECKING:
    from localfab.hub import DownloadProgress
    from localfab.remote.client import Remote
    from localfab.store import Store
    from localfab.store.catalog import CatalogEntry

# A catalog fit judged offline from the catalog's shipped facts, not the file's header.
ESTIMATE = "≈"


@dataclass(frozen=True)
class ModelRow:
    """One local model as the models screen lists it."""

    name: str
    size: str
    quant: str
    arch: str
    last_used: str
    path: Path | None = None


@dataclass(frozen=True)
class CatalogRow:
    """One curated model as the catalog lists it, with what this machine already holds of it."""

    name: str
    title: str
    size: str
    params: str
    context: str
    license: str
    note: str
    repo: str
    local: str | None = None  # the name it is registered under, once downloaded
    kept: int = 0  # bytes of an unfinished download, which the next pull resumes from

    def matches(self, text: str) -> bool:
        """Whether every word of the filter is in the name, title, repo, params or note."""
        hay = " ".join((self.name, self.title, self.repo, self.params, self.note)).casefold()
        return all(word in hay for word in text.casefold().split())


@runtime_checkable
class ListsRemotes(Protocol):
    """A model source that also lists the models of remote servers (slow: a worker)."""

    def remote_rows(self) -> list[RemoteRow]: ...


class ModelSource(Protocol):
    """Where the models screen gets its rows and fit verdicts (a fake in tests)."""

    def rows(self) -> list[ModelRow]: ...

    def fit(self, row: ModelRow) -> str | None:
        """The planner's short verdict ("GPU 8k", "CPU 8k", "too big"); slow: call in a worker."""
        ...


@runtime_checkable
class ModelActions(Protocol):
    """The catalog, fit before download, pulls and removal (a fake in pilot tests).

    Every method but `downloads` may be slow or touch the network: call it in a worker. Errors
    are `LocalfabError`s whose message says what to do.
    """

    @property
    def downloads(self) -> PullQueue:
        """The app's download queue (it outlives the models screen)."""
        ...

    def catalog(self) -> list[CatalogRow]: ...

    def remote_fit(self, row: CatalogRow) -> str:
        """The fit verdict for a catalog model, from its GGUF header read on the hub."""
        ...

    def removal_question(self, name: str) -> str:
        """What removing `name` would do, as a yes/no question."""
        ...

    def remove(self, name: str) -> str:
        """Remove `name`; returns what was done."""
        ...


class LocalModels:
    """Registered and built-in models from the store, judged by the planner; the curated
    catalog with fit verdicts read from the hub; pulls through `localfab.hub`."""

    def __init__(self, paths: Paths, remotes: Mapping[str, Remote] | None = None) -> None:
        """`remotes`: the servers the remote tab lists, by label (config's and --remote's)."""
        from localfab.runtime import FitJudge

        self.paths = paths
        self.remotes = dict(remotes or {})
        self._judge = FitJudge()
        self._queue: PullQueue | None = None
        self._remote_fits: dict[str, str] = {}
        self._probe = threading.Lock()  # the screen judges several catalog models at once

    def _store(self) -> Store:
        from localfab.store import Store

        return Store(self.paths)

    def remote_rows(self) -> list[RemoteRow]:
        """Each remote's models (`/v1/models`), or why it could not be asked."""
        return [row for label, remote in self.remotes.items() for row in remote_rows(label, remote)]

    def rows(self) -> list[ModelRow]:
        from localfab.units import human_age, human_size

        out = []
        for e in self._store().list():
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

    # the catalog --------------------------------------------------------------------------------
    def catalog(self) -> list[CatalogRow]:
        from localfab.store.catalog import load_catalog

        store = self._store()
        have = {
            (e.repo, e.files[0].name): e.name
            for e in store.list()
            if e.repo and e.files and e.present
        }
        return [
            catalog_row(c, local=have.get((c.repo, c.files[0])), kept=kept_bytes(store, c))
            for c in load_catalog()
        ]

    def remote_fit(self, row: CatalogRow) -> str:
        cached = self._remote_fits.get(row.name)
        if cached is not None:
            return cached
        from localfab.errors import HubUnreachable
        from localfab.gguf.facts import read_facts
        from localfab.gguf.summary import catalog_facts
        from localfab.hub import open_remote
        from localfab.plan import Wishes, plan
        from localfab.plan.summary import summarise_plan

        with self._probe:
            machine = self._judge.machine()
        if machine is None:
            raise LocalfabError(
                "this machine's memory could not be probed, so no fit can be judged: "
                "`localfab plan MODEL` says why"
            )
        try:
            remote = open_remote(row.name)
        except HubUnreachable:
            shipped = catalog_facts(row.name)
            if shipped is None:
                raise
            # Offline: the catalog's facts give the fit at once, marked as an estimate and not
            # kept, so that a check once connected reads the file's own header.
            return ESTIMATE + summarise_plan(plan(shipped[0], machine, Wishes()))
        verdict = summarise_plan(plan(read_facts(remote.sources[0]), machine, Wishes()))
        self._remote_fits[row.name] = verdict
        return verdict

    # pulls and removal --------------------------------------------------------------------------
    @property
    def downloads(self) -> PullQueue:
        if self._queue is None:
            self._queue = PullQueue(self.pull)
        return self._queue

    def pull(
        self,
        name: str,
        progress: Callable[[DownloadProgress], None],
        cancel: threading.Event,
    ) -> str:
        """Download `name` into the store as `localfab pull` does; returns what was pulled."""
        from localfab.hub import Hub, HubConfig

        if cancel.is_set():
            raise PullCancelled(f"the download of {name} was cancelled")
        result = Hub(HubConfig.from_env()).pull(name, store=self._store(), progress=progress)
        entry = result.entry
        size = format_bytes(entry.size, precise=True) if entry.size else "?"
        if result.already_present:
            return f"{entry.name} is already here ({size})"
        check = "sha256 verified" if result.verified else "size checked: no sha256 published"
        resumed = (
            f", resumed from {format_bytes(result.resumed, precise=True)}" if result.resumed else ""
        )
        return f"pulled {entry.name}: {size} ({check}{resumed})"

    def removal_question(self, name: str) -> str:
        entry = self._store().get(name)
        if entry is None:
            return f"forget {name}?"
        if not entry.owned:
            return f"Forget {entry.name}? The file stays at {entry.path}."
        size = f"{format_bytes(entry.size, precise=True)} of files" if entry.size else "its files"
        return f"Remove {entry.name} and delete {size}?"

    def remove(self, name: str) -> str:
        removed = self._store().remove(name)
        if removed.kept:
            return f"forgot {removed.name}; the file stays at {removed.kept[0]}"
        return f"removed {removed.name}, freed {format_bytes(removed.bytes_freed, precise=True)}"


def catalog_row(c: CatalogEntry, *, local: str | None = None, kept: int = 0) -> CatalogRow:
    """A catalog entry as the screen lists it."""
    ctx = c.context_length
    return CatalogRow(
        name=c.name,
        title=c.title,
        size=f"~{format_bytes(c.size_bytes, precise=True)}",
        params=c.params,
        context=format_context(ctx),
        license=c.license,
        note=c.note,
        repo=c.repo,
        local=local,
        kept=kept,
    )


def kept_bytes(store: Store, c: CatalogEntry) -> int:
    """Bytes of unfinished downloads of the entry's files (a pull resumes from them)."""
    from localfab.store import PARTIAL_DIR

    folder = store.repo_dir(c.repo) / PARTIAL_DIR
    if not folder.is_dir():
        return 0
    total = 0
    for file in c.files:
        for partial in folder.glob(f"{glob.escape(file)}.*.partial"):
            try:
                total += partial.stat().st_size
            except OSError:
                continue
    return total
