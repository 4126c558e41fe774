"""GGUF headers that lie: wrong types, impossible counts, memory bombs, files that are not files.

Each of these once gave a traceback, a plan with "inf tok/s", gigabytes of memory or the wrong
reason; each must now be one clear `ModelError` (exit code 3 on the command line).
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from gguf.constants import GGUFValueType

from localfab.errors import ModelCorrupt, ModelError
from localfab.gguf.facts import MAX_LAYERS, read_facts
from tests.conftest import LOCALFAB
from tests.gguf_fixtures import SparseSource, Typed, build_header, write_sparse

V = GGUFValueType


def tiny(overrides: dict[str, Any] | None = None, *, layers: int = 2) -> tuple[bytes, int]:
    """A small, valid llama header with `layers` layers of tensors; `overrides` edit it."""
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "llama.block_count": layers,
        "llama.context_length": 4096,
        "llama.embedding_length": 256,
        "llama.feed_forward_length": 512,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(64)],
    }
    for key, value in (overrides or {}).items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    tensors = [("token_embd.weight", [256, 64], 0)] + [
        (f"blk.{il}.attn_q.weight", [256, 256], 0) for il in range(layers)
    ]
    return build_header(meta, tensors)


def test_the_tiny_header_is_valid() -> None:
    f = read_facts(SparseSource(*tiny()))
    assert (f.n_layer, f.n_embd, f.n_head, f.n_head_kv, f.key_length) == (2, 256, 4, 2, 64)
    assert f.n_vocab == 64 and f.n_ctx_train == 4096


# --- wrong types -------------------------------------------------------------------------------

WRONG_TYPES = {
    "embedding as a string": ("llama.embedding_length", "abc", "string"),
    "block count NaN": ("llama.block_count", float("nan"), "float (nan)"),
    "block count as a float": ("llama.block_count", 2.0, "float"),
    "heads as a boolean": ("llama.attention.head_count", True, "boolean"),
    "heads as strings": ("llama.attention.head_count", ["4", "4"], "string"),
    "context as a float": ("llama.context_length", Typed(V.FLOAT64, 4096.0), "float"),
    "window as a string": ("llama.attention.sliding_window", "512", "string"),
    "key length NaN": ("llama.attention.key_length", float("nan"), "float"),
    "vocabulary of numbers": ("tokenizer.ggml.tokens", [1, 2, 3], "array of strings"),
    "vocab size as a string": ("llama.vocab_size", "lots", "string"),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_wrong_typed_metadata_is_a_corrupt_model(case: str) -> None:
    key, value, said = WRONG_TYPES[case]
    overrides: dict[str, Any] = {key: value}
    if key == "llama.vocab_size":
        overrides["tokenizer.ggml.tokens"] = None
    with pytest.raises(ModelCorrupt) as info:
        read_facts(SparseSource(*tiny(overrides)))
    message = str(info.value)
    assert "synthetic.gguf is corrupt" in message and key in message and said in message
    assert "download it again" in message


# --- impossible counts -------------------------------------------------------------------------

IMPOSSIBLE = {
    "negative layers": ({"llama.block_count": Typed(V.INT32, -5)}, "block_count is -5"),
    "no layers": ({"llama.block_count": 0}, "block_count is 0"),
    "no heads": ({"llama.attention.head_count": 0}, "head_count is 0"),
    "no heads in any layer": ({"llama.attention.head_count": [0, 0]}, "head_count is 0"),
    "no KV heads": ({"llama.attention.head_count_kv": 0}, "head_count_kv is 0"),
    "negative KV heads": (
        {"llama.attention.head_count_kv": Typed(V.INT32, -2)},
        "head_count_kv is -2",
    ),
    "no embedding": ({"llama.embedding_length": 0}, "embedding_length is 0"),
    "fewer dims than heads": ({"llama.embedding_length": 3}, "smaller than the 4 attention heads"),
    "zero key length": ({"llama.attention.key_length": 0}, "key_length is 0"),
    "zero value length": ({"llama.attention.value_length": 0}, "value_length is 0"),
    "negative context": ({"llama.context_length": Typed(V.INT64, -1)}, "context_length is -1"),
    "zero context": ({"llama.context_length": 0}, "context_length is 0"),
    "empty vocabulary": ({"tokenizer.ggml.tokens": Typed(V.ARRAY, [], V.STRING)}, "empty"),
    "zero vocab size": (
        {"tokenizer.ggml.tokens": None, "llama.vocab_size": 0},
        "vocab_size is 0",
    ),
    "negative window": (
        {"llama.attention.sliding_window": Typed(V.INT32, -512)},
        "sliding_window is -512",
    ),
    "negative window period": (
        {
            "llama.attention.sliding_window": 512,
            "llama.attention.sliding_window_pattern": Typed(V.INT32, -3),
        },
        "sliding_window_pattern is -3",
    ),
    "window pattern of the wrong length": (
        {"llama.attention.sliding_window": 512, "llama.attention.sliding_window_pattern": [True]},
        "has 1 entries for 2 layers",
    ),
    "per-layer heads of the wrong length": (
        {"llama.attention.head_count": [4, 4, 4]},
        "has 3 per-layer entries for 2 layers",
    ),
    "negative per-layer feed-forward": (
        {"llama.feed_forward_length": Typed(V.ARRAY, [512, -1], V.INT32)},
        "entry 1 is -1",
    ),
    "too many experts": ({"llama.expert_count": 5000}, "expert_count is 5000"),
    "more experts used than exist": (
        {"llama.expert_count": 8, "llama.expert_used_count": 9},
        "is 9, more than the 8 experts",
    ),
    "experts but none used": (
        {"llama.expert_count": 8, "llama.expert_used_count": 0},
        "is 0 with 8 experts",
    ),
    "more layers than llama.cpp loads": (
        {"llama.block_count": 100_000},
        f"outside 1..{MAX_LAYERS}",
    ),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE))
def test_impossible_counts_are_refused(case: str) -> None:
    overrides, said = IMPOSSIBLE[case]
    with pytest.raises(ModelCorrupt) as info:
        read_facts(SparseSource(*tiny(overrides)))
    assert said in str(info.value) and "is corrupt" in str(info.value)


def test_more_layers_than_the_file_has_tensors_for() -> None:
    header, total = tiny({"llama.block_count": 40}, layers=3)
    with pytest.raises(ModelCorrupt, match=r"says 40 layers but the file holds tensors for 3"):
        read_facts(SparseSource(header, total))


def test_hybrid_and_attention_free_models_keep_their_zero_heads() -> None:
    """Zeros that real files do hold: per-layer heads of 0 (hybrid models) and Mamba's 0 heads."""
    hybrid = read_facts(
        SparseSource(
            *tiny({"llama.attention.head_count": [4, 0], "llama.attention.head_count_kv": [2, 0]})
        )
    )
    assert hybrid.n_head == (4, 0) and hybrid.head_kv(1) == 0 and hybrid.key_length == 64
    meta = {
        "general.architecture": "mamba",
        "mamba.block_count": 2,
        "mamba.context_length": 1_048_576,
        "mamba.embedding_length": 768,
        "mamba.attention.head_count": 0,
        "mamba.attention.head_count_kv": 0,
    }
    mamba = read_facts(SparseSource(*build_header(meta, [("blk.1.ssm_in.weight", [768, 32], 0)])))
    assert mamba.n_head == 0 and mamba.key_length == 0


# --- bounded work --------------------------------------------------------------------------------


def bomb(path: Path) -> Path:
    """The probe's 218-byte file: a header declaring 200 million layers and nothing else."""
    meta = {
        "general.architecture": "llama",
        "llama.block_count": 200_000_000,
        "llama.embedding_length": 4096,
        "llama.attention.head_count": 32,
    }
    header, _ = build_header(meta, [])
    path.write_bytes(header)
    return path


def test_a_header_declaring_200_million_layers_is_refused_at_once(tmp_path: Path) -> None:
    path = bomb(tmp_path / "bomb.gguf")
    assert path.stat().st_size < 256
    with pytest.raises(ModelCorrupt, match=r"block_count is 200000000, outside 1\.\.512"):
        read_facts(path)


class BudgetSource(SparseSource):
    """A remote-like source that fails the test as soon as it is asked for too many bytes."""

    def __init__(self, header: bytes, total: int, *, known_size: bool, budget: int) -> None:
        super().__init__(header, total, label="owner/repo/model.gguf")
        self.known_size = known_size
        self.budget = budget
        self.fetched = 0

    def read(self, offset: int, size: int) -> bytes:
        self.fetched += min(size, max(0, self.total - offset))
        assert self.fetched <= self.budget, f"fetched {self.fetched} bytes of a hostile header"
        return super().read(offset, size)

    def size(self) -> int | None:
        return self.total if self.known_size else None


def _array_header(item_type: GGUFValueType, count: int) -> bytes:
    """A header whose vocabulary array declares `count` items but holds none."""
    key = b"tokenizer.ggml.tokens"
    return b"".join(
        [
            b"GGUF",
            struct.pack("<IQQ", 3, 0, 2),
            struct.pack("<Q", len(b"general.architecture")) + b"general.architecture",
            struct.pack("<IQ", V.STRING, 5) + b"llama",
            struct.pack("<Q", len(key)) + key,
            struct.pack("<IIQ", V.ARRAY, item_type, count),
        ]
    )


@pytest.mark.parametrize("known_size", [True, False], ids=["size known", "size unknown"])
@pytest.mark.parametrize(
    ("item_type", "count"),
    [(V.STRING, 2**30), (V.STRING, 2**60), (V.UINT32, 2**61), (V.STRING, 4000)],
    ids=["1G strings", "2^60 strings", "2^61 ints", "4000 strings"],
)
def test_a_remote_header_declaring_a_huge_array_fetches_little(
    known_size: bool, item_type: GGUFValueType, count: int
) -> None:
    # a 16 GiB remote file of zeros after the header: zero-length strings, 8 bytes each
    source = BudgetSource(
        _array_header(item_type, count), 16 << 30, known_size=known_size, budget=64 << 20
    )
    with pytest.raises(ModelError) as info:
        read_facts(source)
    assert "owner/repo/model.gguf" in str(info.value)
    assert source.fetched < 16 << 20


def test_counts_larger_than_the_file_are_truncation_not_allocation(tmp_path: Path) -> None:
    header = b"GGUF" + struct.pack("<IQQ", 3, 100_000, 50_000)
    path = write_sparse(tmp_path / "short.gguf", header, len(header) + 64)
    with pytest.raises(ModelError, match="truncated"):
        read_facts(path)


# --- files that are not (readable) files ---------------------------------------------------------


def test_unreadable_file_says_permission_denied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_sparse(tmp_path / "locked.gguf", *tiny())
    real_open = pathlib.Path.open

    def deny(self: pathlib.Path, *args: Any, **kwargs: Any) -> Any:
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", deny)
    with pytest.raises(ModelError) as info:
        read_facts(path)
    message = str(info.value)
    assert "permission denied" in message and "chmod u+r" in message
    assert "too short" not in message and "not a GGUF" not in message


def test_chmod_000_file_says_permission_denied(tmp_path: Path) -> None:
    path = write_sparse(tmp_path / "locked.gguf", *tiny())
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("this user reads files whatever their mode (root)")
        with pytest.raises(ModelError, match="permission denied"):
            read_facts(path)
    finally:
        path.chmod(0o644)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelError, match=r"is not a regular file \(it is a named pipe"):
        read_facts(fifo)  # must not block on opening it either


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null here")
def test_symlink_to_a_device_is_not_a_regular_file(tmp_path: Path) -> None:
    link = tmp_path / "null.gguf"
    link.symlink_to("/dev/null")
    with pytest.raises(ModelError, match=r"is not a regular file \(it is a character device"):
        read_facts(link)


def test_dangling_symlink_names_its_target(tmp_path: Path) -> None:
    link = tmp_path / "gone.gguf"
    link.symlink_to(tmp_path / "elsewhere.gguf")
    with pytest.raises(ModelError, match=r"symbolic link to .*elsewhere\.gguf.*does not exist"):
        read_facts(link)


# --- the command line ----------------------------------------------------------------------------

# Runs `localfab ARGS` under an address-space limit (a regression then fails fast instead of
# taking the machine's memory) and reports the child's exit code, stderr and peak RSS.
_MEASURE = textwrap.dedent(
    """
    import json, resource, subprocess, sys
    if hasattr(resource, "RLIMIT_AS"):
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"rc": done.returncode, "stderr": done.stderr, "peak_kib": peak_kib}))
    """
)


def lf_measured(*args: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(LOCALFAB), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _cli_file(kind: str, folder: Path) -> Path:
    if kind == "memory bomb":
        return bomb(folder / "bomb.gguf")
    overrides: dict[str, Any] = {
        "wrong type": {"llama.embedding_length": "abc"},
        "NaN": {"llama.block_count": float("nan")},
        "impossible count": {"llama.block_count": Typed(V.INT32, -5)},
        "no heads": {"llama.attention.head_count": 0},
    }[kind]
    return write_sparse(folder / f"{kind.replace(' ', '-')}.gguf", *tiny(overrides))


@pytest.mark.parametrize("command", ["show", "plan"])
@pytest.mark.parametrize(
    "kind", ["wrong type", "NaN", "impossible count", "no heads", "memory bomb"]
)
def test_cli_reports_a_corrupt_model_in_one_line(
    command: str, kind: str, tmp_path: Path, lf_env: dict[str, str]
) -> None:
    path = _cli_file(kind, tmp_path)
    done = lf_measured(command, str(path), env=lf_env)
    stderr = done["stderr"]
    assert done["rc"] == 3, stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("localfab: error: ") and f"{path} is corrupt" in stderr
    assert "inf tok/s" not in stderr
    # the 218-byte bomb once took 7.5 GB; reading a header is a few dozen MB over the imports
    assert done["peak_kib"] < 500 * 1024, f"peak RSS {done['peak_kib']} KiB"


@pytest.mark.parametrize("known_size", [True, False], ids=["size known", "size unknown"])
def test_a_tensor_of_impossible_shape_is_refused(known_size: bool) -> None:
    header, _ = build_header(
        {"general.architecture": "llama", "llama.block_count": 1},
        [("blk.0.attn_q.weight", [2**40, 2**40], 0)],
    )
    source = BudgetSource(header, 1 << 40, known_size=known_size, budget=1 << 20)
    with pytest.raises(ModelCorrupt, match=r"impossible shape \[1099511627776, 1099511627776\]"):
        read_facts(source)


def test_per_layer_heads_without_kv_heads_share_the_array() -> None:
    meta = {
        "general.architecture": "openelm",
        "openelm.block_count": 3,
        "openelm.embedding_length": 128,
        "openelm.attention.head_count": [4, 4, 8],
    }
    f = read_facts(SparseSource(*build_header(meta, [])))
    assert f.n_head == f.n_head_kv == (4, 4, 8) and f.head_kv(2) == 8
