"""The models a router serves, found as llama-server's router finds them (server-models.cpp).

Sources, later ones winning on a name: localfab's own store (its registered models, by name),
the Hugging Face cache (`$LLAMA_CACHE`, else the hub cache; `owner/name:TAG` per GGUF file),
`--models-dir` (each `.gguf` by its stem, each folder by its name) and `--models-preset` (an INI
file: `[name]` sections of llama-server flags without their dashes, `[*]` under every one).
"""

from __future__ import annotations

import configparser
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from localfab.errors import UsageError

SKIP_PARTS = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")
SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
TAG = re.compile(r"[-.]([A-Za-z0-9_]+)$")
# Preset keys that are the router's own, never passed to a model's server.
PRESET_ONLY = {"load-on-startup", "stop-timeout", "version"}
ROUTER_ONLY = {"models-dir", "models-max", "models-preset", "models-memory", "api-key"}


@dataclass
class RouterModel:
    """One model the router can load: its file and the flags its server gets."""

    id: str
    path: Path | None
    source: str  # "store", "cache", "models_dir", "preset"
    args: list[str] = field(default_factory=list)
    aliases: tuple[str, ...] = ()
    load_on_startup: bool = False
    stop_timeout: float = 10.0
    hf_repo: str | None = None  # resolved from the cache when the model loads
    draft_hf: str | None = None  # spec-draft-hf: its draft model, from the cache
    dedup: bool = False  # dedup-cache-models: hide the cache entries of its files
    hidden: bool = False  # left out of GET /models (still served by its name)


def hub_cache() -> Path:
    """Where Hugging Face models are cached, in llama.cpp's order of variables."""
    for var in ("LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "huggingface" / "hub"


def file_tag(name: str) -> str | None:
    """A GGUF file's quantization tag as llama.cpp reads it (None: no tag, or not a first
    shard)."""
    stem = name.removesuffix(".gguf")
    shard = SHARD.search(stem)
    if shard is not None:
        if shard.group(1) != "00001":
            return None
        stem = stem[: shard.start()]
    match = TAG.search(stem)
    return match.group(1).upper() if match else None


def _snapshot(repo_dir: Path) -> Path | None:
    refs = repo_dir / "refs"
    ref = refs / "main"
    if not ref.is_file():
        ref = next((p for p in sorted(refs.glob("*")) if p.is_file()), ref)
    if not ref.is_file():
        return None
    snapshot = repo_dir / "snapshots" / ref.read_text().strip()
    return snapshot if snapshot.is_dir() else None


def scan_cache(cache: Path) -> dict[str, RouterModel]:
    """`owner/name:TAG` for each model GGUF in the hub cache's snapshots."""
    found: dict[str, RouterModel] = {}
    for repo_dir in sorted(cache.glob("models--*--*")):
        snapshot = _snapshot(repo_dir)
        if snapshot is None:
            continue
        repo = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        for file in sorted(snapshot.rglob("*.gguf")):
            tag = file_tag(file.name)
            if tag is None or any(part in file.name.lower() for part in SKIP_PARTS):
                continue
            name = f"{repo}:{tag}"
            found.setdefault(name, RouterModel(name, file, "cache"))
    return found


def resolve_hf(repo: str, cache: Path) -> Path | None:
    """The cached file of `owner/name[:TAG]` (without a tag: Q4_K_M, else Q8_0, else the first)."""
    base, _, tag = repo.partition(":")
    models = {k: m for k, m in scan_cache(cache).items() if k.split(":")[0] == base}
    if tag:
        hit = models.get(f"{base}:{tag.upper()}")
        return hit.path if hit else None
    for want in ("Q4_K_M", "Q8_0"):
        if f"{base}:{want}" in models:
            return models[f"{base}:{want}"].path
    return next((m.path for m in models.values()), None)


def scan_models_dir(folder: Path) -> dict[str, RouterModel]:
    """Each `.gguf` at the top by its stem; each folder holding one by the folder's name."""
    if not folder.is_dir():
        raise UsageError(f"--models-dir {folder} does not exist or is not a directory")
    found: dict[str, RouterModel] = {}
    for entry in sorted(folder.iterdir()):
        if entry.is_file() and entry.suffix == ".gguf":
            if not any(part in entry.name.lower() for part in SKIP_PARTS):
                found[entry.stem] = RouterModel(entry.stem, entry, "models_dir")
        elif entry.is_dir():
            files = [f for f in sorted(entry.glob("*.gguf")) if "mmproj" not in f.name.lower()]
            files = [f for f in files if not f.name.startswith(SKIP_PARTS[1:])]
            first = [f for f in files if "-00001-of-" in f.name] or files
            if first:
                found[entry.name] = RouterModel(entry.name, first[0], "models_dir")
    return found


def _flag(key: str, value: str) -> list[str]:
    """An INI key and value as command-line arguments (`c = 512` -> `-c 512`)."""
    dashes = "-" if len(key) <= 3 and "-" not in key else "--"
    lowered = value.strip().lower()  # (on/off/1/0 are values: -fa on, --mlock 1 ...)
    if lowered in ("true", "yes", "enabled"):
        return [dashes + key]
    if lowered in ("false", "no", "disabled"):
        return [] if key.startswith("no-") else ["--no-" + key]
    return [dashes + key, value.strip()]


def read_preset(path: Path, cache: Path, known: dict[str, RouterModel]) -> dict[str, RouterModel]:
    """The models of a preset file, merged over those already `known` by the same name."""
    parser = configparser.ConfigParser(
        inline_comment_prefixes=(";", "#"),
        comment_prefixes=(";", "#"),
        default_section="\0",
        strict=False,
    )
    try:
        parser.read_string("[default]\n" + path.read_text(), source=str(path))
    except (OSError, configparser.Error) as exc:
        raise UsageError(f"--models-preset {path}: {exc}") from exc
    common = dict(parser["*"]) if parser.has_section("*") else {}
    found: dict[str, RouterModel] = {}
    for name in parser.sections():
        if name == "*" or (name == "default" and not dict(parser[name])):
            continue
        keys = {**common, **dict(parser[name])}
        found[name] = _preset_model(name, keys, cache, known.get(name), path)
    return found


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "on", "yes")


def dedup(models: dict[str, RouterModel], cache: Path) -> None:
    """Hide the cache entries whose files a preset marked dedup-cache-models already serves
    (its model and its draft), and give such a preset its draft model's file."""
    files: set[Path] = set()
    for model in models.values():
        draft = resolve_hf(model.draft_hf, cache) if model.draft_hf else None
        if draft is not None and "-md" not in model.args:
            model.args += ["-md", str(draft)]
        if model.dedup:
            main = model.path or (resolve_hf(model.hf_repo, cache) if model.hf_repo else None)
            files |= {f.resolve() for f in (main, draft) if f is not None}
    for model in models.values():
        if model.source == "cache" and model.path is not None:
            model.hidden = model.path.resolve() in files


def _preset_model(
    name: str, keys: dict[str, str], cache: Path, base: RouterModel | None, source: Path
) -> RouterModel:
    model = RouterModel(name, base.path if base else None, "preset", hf_repo=None)
    for key, value in keys.items():
        key = key.lower().removeprefix("--")
        if key in ("model", "m"):
            model.path = Path(value.strip()).expanduser()
        elif key in ("hf-repo", "hf", "hfr"):
            model.hf_repo = value.strip()
        elif key == "load-on-startup":
            model.load_on_startup = _truthy(value)
        elif key == "stop-timeout":
            try:
                model.stop_timeout = float(value)
            except ValueError:
                raise UsageError(
                    f"--models-preset {source}: [{name}] stop-timeout {value!r} "
                    "is not a number of seconds"
                ) from None
        elif key == "dedup-cache-models":
            model.dedup = _truthy(value)
        elif key in ("spec-draft-hf", "hfd", "hf-repo-draft"):
            model.draft_hf = value.strip()
        elif key == "alias":
            model.aliases = tuple(a.strip() for a in value.split(",") if a.strip())
        elif key not in PRESET_ONLY and key not in ROUTER_ONLY:
            model.args += _flag(key, value)
    if model.path is None and model.hf_repo is None:
        raise UsageError(f"--models-preset {source}: [{name}] names no model (model or hf-repo)")
    return model
