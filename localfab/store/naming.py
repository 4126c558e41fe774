"""Names and paths the store trusts: model names, repo folders, repo file names, quants.

Names are short labels (`qwen2.5:7b`), never used to build file paths; repo ids and repo file names
that do become paths are checked by `safe_repo_dir` and `safe_file_name`. Text that reaches a
terminal is checked for control characters (`has_control_chars`) or escaped (`printable`).
"""

from __future__ import annotations

import re
from pathlib import Path

from localfab.errors import UsageError
from localfab.store.catalog import NAME_RE, SPLIT_RE, check_repo_id

# Characters that move the cursor, change colours or reorder text on a terminal: file names and
# model names that carry them are refused, never written to disk or printed.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_QUANT_IN_NAME = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d_[A-Z0-9_]*[A-Z0-9]|BF16|F16|F32|MXFP4(?:_MOE)?)(?=[-.]|$)",
    re.IGNORECASE,
)


def has_control_chars(text: str) -> bool:
    """Whether `text` holds control characters (newline, ESC, C1, bidi overrides...)."""
    return _CONTROL_RE.search(text) is not None


def printable(text: str) -> str:
    """`text` with control characters shown as escapes (`\\x1b`), safe to print on a terminal."""
    return _CONTROL_RE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def is_valid_name(name: str) -> bool:
    """Whether `name` is a usable model name (see `validate_name`)."""
    return bool(NAME_RE.match(name)) and ".." not in name


def validate_name(name: str) -> str:
    """Return `name` if it is a usable model name, else raise `UsageError` saying what is."""
    if not is_valid_name(name):
        raise UsageError(
            f"{name!r} is not a valid model name: use letters, digits and . _ - : + "
            f"(at most 128, starting with a letter or digit, no '..'), e.g. qwen2.5:7b"
        )
    return name


def safe_repo_dir(repo: str) -> str:
    """The folder name for a hub repo (`owner--name`); refuses ids that could escape the store."""
    return check_repo_id(repo).replace("/", "--")


def safe_file_name(repo_file: str) -> str:
    """The local file name for a repo file path; refuses traversal, hidden and odd names.

    Only the last path component is kept (files in repo sub-folders land beside the others), and
    it must be a plain `.gguf` name.
    """
    parts = repo_file.split("/")
    bad = (
        not repo_file
        or "\\" in repo_file
        or has_control_chars(repo_file)
        or repo_file.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
    )
    base = parts[-1] if parts else ""
    if bad or base.startswith(".") or not base.lower().endswith(".gguf") or len(base) > 255:
        raise UsageError(
            f"refusing repo file name {ascii(repo_file)}: not a plain .gguf file name "
            f"(path traversal, hidden, absolute names or control characters are never written "
            f"to disk)"
        )
    return base


def default_name(path: Path) -> str:
    """Name from a file: `Qwen2.5-7B-Instruct-Q4_K_M.gguf` -> `qwen2.5-7b-instruct-q4_k_m`.

    Split parts give the name of the whole model; characters a name cannot hold become `-`.
    """
    stem = path.name
    m = SPLIT_RE.match(stem)
    stem = m.group("stem") if m else re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    name = re.sub(r"[^A-Za-z0-9._:+-]+", "-", stem).strip("-._").lower()
    name = re.sub(r"\.{2,}", ".", name)[:128]
    return name or "model"


def quant_from_name(file_name: str) -> str | None:
    """The quant a file name carries (`...-Q4_K_M.gguf` -> `Q4_K_M`), or None."""
    m = _QUANT_IN_NAME.search(Path(file_name).name)
    return m.group(1).upper() if m else None


def quant_from_file_type(file_type: int | None) -> str | None:
    """The usual name of a `general.file_type` (gguf's `LlamaFileType`): 15 -> `Q4_K_M`."""
    if file_type is None:
        return None
    from gguf import LlamaFileType  # numpy: only when a file is read

    try:
        kind = LlamaFileType(file_type)
    except ValueError:
        return None
    if kind is LlamaFileType.GUESSED:
        return None
    return kind.name.removeprefix("MOSTLY_").removeprefix("ALL_")


def gguf_summary(path: Path) -> tuple[str | None, str | None]:
    """(architecture, quant) from a GGUF header; raises `ModelError` if the file is not GGUF."""
    from localfab.gguf.facts import read_facts  # imports `gguf` (numpy): only when a file is added

    facts = read_facts(path)
    return facts.arch, quant_from_file_type(facts.file_type) or quant_from_name(path.name)
