"""`Hub`: one hub endpoint (huggingface.co or a mirror), through the `huggingface_hub` library.

The hub metadata (HEAD with `X-Repo-Commit`, `X-Linked-Etag`, `X-Linked-Size`, redirects to the
CDN), the tree listing, auth headers, `HF_ENDPOINT` mirrors and the error types all come from the
library's public API; downloads are in `localfab.hub.download`, header reads in
`localfab.hub.remote`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from localfab.hub.errors import file_metadata, hub_error
from localfab.hub.files import FileMeta, RemoteFile, ResolvedModel, pick_files, pick_projector
from localfab.hub.refs import DEFAULT_REVISION, HubConfig, ModelRef, parse_ref
from localfab.store import Store, default_name, quant_from_name, validate_name
from localfab.store.catalog import SPLIT_RE

if TYPE_CHECKING:
    from localfab.hub.download import PullResult
    from localfab.hub.progress import ProgressCallback
    from localfab.hub.remote import HttpRangeSource, RemoteModel


class Hub:
    """Talks to one hub endpoint (huggingface.co or a mirror) through `huggingface_hub`."""

    def __init__(self, config: HubConfig | None = None) -> None:
        self.config = HubConfig.from_env() if config is None else config
        self._meta: dict[tuple[str, str, str], FileMeta] = {}  # one HEAD per file per pull

    def for_ref(self, ref: ModelRef) -> Hub:
        """This hub, or one for the other host a pasted URL names (no token, same offline)."""
        if ref.endpoint and ref.endpoint != self.config.endpoint:
            return Hub(self.config.for_endpoint(ref.endpoint))
        return self

    def file_url(self, repo: str, file: str, *, revision: str = DEFAULT_REVISION) -> str:
        """`{endpoint}/{repo}/resolve/{revision}/{file}`."""
        return self.config.file_url(repo, file, revision=revision)

    def list_files(self, repo: str, *, revision: str = DEFAULT_REVISION) -> list[RemoteFile]:
        """Every file in the repo (recursive tree listing), with sizes and LFS sha256."""
        self.config.check_online(repo)
        from huggingface_hub import HfApi, RepoFile

        api = HfApi(endpoint=self.config.endpoint, token=self.config.auth)
        try:
            items = list(api.list_repo_tree(repo, recursive=True, revision=revision))
        except Exception as exc:
            raise hub_error(exc, self.config, repo=repo, revision=revision) from exc
        files = []
        for item in items:
            if isinstance(item, RepoFile):
                sha = item.lfs.sha256 if item.lfs is not None else None
                files.append(RemoteFile(path=item.path, size=item.size, sha256=sha))
        return files

    def lister(self, repo: str, revision: str) -> Sequence[RemoteFile]:
        """`list_files` in the shape error messages use to name the files a repo has."""
        return self.list_files(repo, revision=revision)

    def metadata(self, repo: str, file: str, *, revision: str = DEFAULT_REVISION) -> FileMeta:
        """HEAD the file: commit, sha256 (X-Linked-Etag/ETag), size (X-Linked-Size), location."""
        cached = self._meta.get((repo, file, revision))
        if cached is not None:
            return cached
        result = file_metadata(self.config, repo, file, revision=revision, lister=self.lister)
        self._meta[(repo, file, revision)] = result
        return result

    def resolve(
        self, ref: ModelRef | str, *, name: str | None = None, projector: bool = True
    ) -> ResolvedModel:
        """The file(s) `ref` means: an exact file (with split siblings) or the quant's file(s);
        with `projector`, also the repo's vision projector for it (`pick_projector`), where the
        repo is listed anyway or the catalog says the model reads images."""
        ref = parse_ref(ref) if isinstance(ref, str) else ref
        listing: list[RemoteFile] | None = None
        if ref.file is not None and not SPLIT_RE.match(ref.file.split("/")[-1]):
            # One known file: a HEAD gives size and checksum; no listing needed.
            meta = self.metadata(ref.repo, ref.file, revision=ref.revision)
            files: tuple[RemoteFile, ...] = (RemoteFile(ref.file, meta.size, meta.sha256),)
            quant = quant_from_name(ref.file) or ref.quant
            if projector and ref.catalog is not None and ref.catalog.vision:
                listing = list(self.list_files(ref.repo, revision=ref.revision))
        else:
            listing = list(self.list_files(ref.repo, revision=ref.revision))
            files = pick_files(ref, listing, self.config)
            quant = quant_from_name(files[0].path) or ref.wanted_quant
        model_name = name or ref.name or default_name(Path(files[0].path.split("/")[-1]))
        seeing = pick_projector(files[0].path, listing) if projector and listing else None
        return ResolvedModel(
            repo=ref.repo,
            revision=ref.revision,
            quant=quant,
            files=files,
            name=validate_name(model_name),
            projector=seeing,
        )

    def pull(
        self,
        ref: ModelRef | str,
        *,
        store: Store,
        name: str | None = None,
        progress: ProgressCallback | None = None,
        projector: bool = True,
    ) -> PullResult:
        """Download (or resume) the model's files (and its vision projector, unless not
        `projector`), verify them, then register it in `store`."""
        from localfab.hub import download

        ref = parse_ref(ref) if isinstance(ref, str) else ref
        if name is not None:
            validate_name(name)
        return download.pull(
            self.for_ref(ref), ref, store=store, name=name, progress=progress, projector=projector
        )

    def range_source(
        self,
        repo: str,
        file: str,
        *,
        revision: str = DEFAULT_REVISION,
        size: int | None = None,
    ) -> HttpRangeSource:
        """A ranged reader over the remote file, for reading its GGUF header before download;
        `size`, when the listing already told it, saves a HEAD."""
        from localfab.hub.remote import HttpRangeSource

        self.config.check_online(f"{repo}/{file}")
        return HttpRangeSource(repo, file, revision=revision, config=self.config, size=size)

    def open_remote(self, ref: ModelRef | str) -> RemoteModel:
        """Resolve `ref` and open a ranged reader on each of its files (part 1 holds the header)."""
        from localfab.hub.remote import RemoteModel

        ref = parse_ref(ref) if isinstance(ref, str) else ref
        hub = self.for_ref(ref)
        resolved = hub.resolve(ref)
        sources = tuple(
            hub.range_source(resolved.repo, f.path, revision=resolved.revision, size=f.size)
            for f in resolved.files
        )
        return RemoteModel(resolved=resolved, sources=sources)
