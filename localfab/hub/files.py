"""What the hub has, and which of it a `ModelRef` means: the GGUF file(s) to fetch.

The default quant is Q4_K_M; a split model (`*-00001-of-0000N.gguf`) is every one of its parts,
in order, or nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

from localfab.errors import HubError, UsageError
from localfab.hub.refs import HubConfig, ModelRef
from localfab.store import quant_from_name, safe_file_name
from localfab.store.catalog import SPLIT_RE

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class RemoteFile:
    """A file in a hub repo, as the tree listing or a HEAD describes it."""

    path: str
    size: int | None
    sha256: str | None


@dataclass(frozen=True)
class ResolvedModel:
    """The exact file(s) a `ModelRef` means, in part order, at a given revision."""

    repo: str
    revision: str
    quant: str | None
    files: tuple[RemoteFile, ...]
    name: str
    projector: RemoteFile | None = None  # the vision projector fetched with it, if any

    @property
    def total_size(self) -> int | None:
        total = 0
        for f in (*self.files, *([self.projector] if self.projector else [])):
            if f.size is None:
                return None
            total += f.size
        return total


@dataclass(frozen=True)
class FileMeta:
    """What a HEAD on `/{repo}/resolve/{rev}/{file}` tells: commit, checksum, size, where to GET."""

    commit: str | None
    etag: str | None
    size: int | None
    location: str

    @property
    def sha256(self) -> str | None:
        return self.etag if self.etag and _SHA256_RE.match(self.etag) else None


def has_quant(path: str, quant: str) -> bool:
    """Whether a repo path carries `quant` as a whole token (case-insensitive)."""
    pattern = rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9_])"
    return re.search(pattern, path, re.IGNORECASE) is not None


def is_split(path: str) -> bool:
    """Whether a repo path is one part of a split GGUF."""
    return SPLIT_RE.match(path.split("/")[-1]) is not None


def pick_files(
    ref: ModelRef, listing: Sequence[RemoteFile], config: HubConfig
) -> tuple[RemoteFile, ...]:
    """Choose the GGUF file(s) for `ref` from the listing `config`'s hub gave; split models give
    every part. A refusal names the hub page where the repo's files can be seen."""
    ggufs = [f for f in listing if f.path.lower().endswith(".gguf")]
    for f in ggufs:
        safe_file_name(f.path)  # a hostile listing must not smuggle in a traversal
    if ref.file is not None:
        return _pick_exact(ref, ref.file, ggufs, config)
    quant = ref.wanted_quant
    candidates = [f for f in ggufs if has_quant(f.path, quant) and "mmproj" not in f.path.lower()]
    if not candidates:
        quants = sorted({q for f in ggufs if (q := quant_from_name(f.path))})
        there = (
            f"; quants there: {', '.join(quants)} (pull {ref.repo}:QUANT)"
            if quants
            else "; it has no .gguf files: pick a repo whose name ends in -GGUF"
        )
        raise HubError(f"{ref.repo} has no {quant} .gguf file{there}{_files_page(ref, config)}")
    groups: dict[str, list[RemoteFile]] = {}
    for f in candidates:
        m = SPLIT_RE.match(f.path.split("/")[-1])
        key = f"{f.path.rpartition('/')[0]}/{m.group('stem')}" if m else f.path
        groups.setdefault(key, []).append(f)
    # Prefer files at the top of the repo, then the shortest (most plain) name.
    best = sorted(groups.values(), key=lambda g: (g[0].path.count("/"), len(g[0].path), g[0].path))
    return _complete_parts(best[0], ref.repo)


def pick_projector(model: str, listing: Sequence[RemoteFile]) -> RemoteFile | None:
    """The vision projector to fetch with the model file `model`, as llama-server's `-hf` picks
    it (common/download.cpp, `find_best_sibling`): a .gguf whose name holds "mmproj", in the
    model's folder or one above it, the deepest such folder first, then the quant whose bits
    are closest to the model's (a Q4_K_M model gets a Q8_0 projector before an F16 one)."""
    model_dir = model.split("/")[:-1]
    model_bits = _quant_bits(model)
    best: tuple[int, int] | None = None
    chosen: RemoteFile | None = None
    for f in listing:
        if not f.path.lower().endswith(".gguf") or "mmproj" not in f.path.lower():
            continue
        folder = f.path.split("/")[:-1]
        if folder != model_dir[: len(folder)]:
            continue  # not in the model's folder or above it
        try:
            safe_file_name(f.path)
        except UsageError:
            continue  # a name no file here may have: not this one
        key = (-len(folder), abs(_quant_bits(f.path) - model_bits))
        if best is None or key < best:
            best, chosen = key, f
    return chosen


def _quant_bits(path: str) -> int:
    """The bits of a file's quant (Q4_K_M: 4, F16: 16); 0 when its name says none."""
    quant = quant_from_name(path.split("/")[-1]) or ""
    digits = re.search(r"\d+", quant)
    return int(digits.group()) if digits else 0


def _pick_exact(
    ref: ModelRef, file: str, ggufs: Sequence[RemoteFile], config: HubConfig
) -> tuple[RemoteFile, ...]:
    m = SPLIT_RE.match(file.split("/")[-1])
    folder = file.rpartition("/")[0]
    if m is None:
        chosen = [f for f in ggufs if f.path == file]
    else:
        chosen = [
            f for f in ggufs if f.path.rpartition("/")[0] == folder and _same_split(f.path, m)
        ]
    if not chosen:
        raise HubError(
            f"{file} is not in {ref.repo} (HTTP 404)"
            f"{_quant_files_message(ggufs, ref.wanted_quant)}{_files_page(ref, config)}"
        )
    return _complete_parts(chosen, ref.repo)


def _files_page(ref: ModelRef, config: HubConfig) -> str:
    """`; the repo's files: URL` on the hub that was asked (a mirror, when HF_ENDPOINT says so)."""
    return f"; the repo's files: {config.page_url(ref.repo)}/tree/{quote(ref.revision, safe='')}"


def _same_split(path: str, m: re.Match[str]) -> bool:
    other = SPLIT_RE.match(path.split("/")[-1])
    return bool(
        other
        and other.group("stem") == m.group("stem")
        and other.group("count") == m.group("count")
    )


def _complete_parts(files: Sequence[RemoteFile], repo: str) -> tuple[RemoteFile, ...]:
    """Single file as is; split parts sorted, and every part 1..N present."""
    first = SPLIT_RE.match(files[0].path.split("/")[-1])
    if first is None:
        return (files[0],)
    count = int(first.group("count"))
    by_part: dict[int, RemoteFile] = {}
    for f in files:
        m = SPLIT_RE.match(f.path.split("/")[-1])
        if m:
            by_part[int(m.group("part"))] = f
    missing = [i for i in range(1, count + 1) if i not in by_part]
    if missing:
        raise HubError(
            f"{repo} has a split model {first.group('stem')} of {count} parts but part(s) "
            f"{', '.join(str(i) for i in missing)} are missing from the repo: it cannot be loaded"
        )
    return tuple(by_part[i] for i in range(1, count + 1))


def _quant_files_message(ggufs: Sequence[RemoteFile], quant: str) -> str:
    wanted = [f.path for f in ggufs if has_quant(f.path, quant)]
    if wanted:
        return f"; {quant} .gguf files there: {', '.join(wanted)}"
    return f"; .gguf files there: {', '.join(f.path for f in ggufs) or 'none'}"
