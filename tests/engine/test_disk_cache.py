"""The prompt cache's disk tier: state files found by prefix, checked whole, bounded, crash-safe,
and shared by processes. The states here are stand-in bytes; `test_state` restores real ones."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localfab.engine.disk_cache import MAGIC, SUFFIX, DiskCache, DiskEntry, StateKey
from localfab.engine.prompt_cache import PromptCache

KEY = StateKey({"name": "m.gguf", "size": 1, "sha256_ends": "ab"}, {"type_k": "f16"})
OTHER = StateKey(KEY.model, {"type_k": "q8_0"})
A = list(range(100, 300))  # a conversation of 200 tokens
B = list(range(1000, 1100))


def cache(folder: Path, key: StateKey = KEY, **kw: object) -> tuple[DiskCache, list[str]]:
    notes: list[str] = []
    return DiskCache(folder, key, note=notes.append, **kw), notes  # type: ignore[arg-type]


def files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_a_prompt_finds_the_file_holding_its_longest_beginning_and_loads_it_whole(tmp_path):
    disk, notes = cache(tmp_path)
    state = bytearray(os.urandom(5000))
    assert disk.store(A, state) > len(state)
    disk.store(B, bytearray(10))
    found = disk.find(A + [1, 2, 3], have=0)
    assert found is not None and found[1] == len(A)
    loaded = disk.load(found[0])
    assert loaded is not None and list(loaded.tokens) == A and loaded.state == state
    assert disk.find(A + [1, 2, 3], have=len(A)) is None  # the sequence holds as much already
    assert disk.find(A[:40] + [7] * 50, have=0) is None  # 40 of 200: under a quarter
    assert notes == []


def test_a_file_of_another_key_is_never_read(tmp_path):
    disk, _ = cache(tmp_path)
    disk.store(A, bytearray(100))
    other, notes = cache(tmp_path, OTHER)
    assert other.find(A, have=0) is None and notes == []
    assert len(files(tmp_path)) == 1  # nor removed: it is the other load's


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "garbage"])
def test_a_corrupt_or_truncated_file_is_discarded_with_a_note(tmp_path, damage):
    disk, notes = cache(tmp_path)
    disk.store(A, bytearray(os.urandom(4000)))
    (path,) = tmp_path.iterdir()
    raw = bytearray(path.read_bytes())
    if damage == "flip a byte":
        raw[-100] ^= 0xFF
    elif damage == "truncate":
        raw = raw[:-1000]
    else:
        raw = bytearray(b"not a state file at all" * 10)
    path.write_bytes(raw)
    fresh, notes = cache(tmp_path)
    found = fresh.find(A, have=0)
    if found is not None:  # the header was whole: the state's check finds it
        assert fresh.load(found[0]) is None
    assert len(notes) == 1 and path.name in notes[0] and "\n" not in notes[0]
    assert not path.exists()


def test_a_longer_prompt_replaces_the_files_it_extends_and_a_covered_one_is_not_written(tmp_path):
    disk, _ = cache(tmp_path)
    disk.store(A[:100], bytearray(10))
    disk.store(A, bytearray(20))
    assert [len(e.tokens) for e in disk.entries()] == [len(A)]
    assert disk.store(A[:150], bytearray(10)) == 0  # the file of A holds it
    assert disk.store(A[:10], bytearray(10)) == 0  # too short to be worth a file


def test_the_least_recently_used_files_go_when_the_folder_runs_over_its_limit(tmp_path):
    disk, _ = cache(tmp_path, limit=3 * 2000)
    prompts = [list(range(k * 1000, k * 1000 + 100)) for k in range(4)]
    for age, p in enumerate(prompts[:3]):
        disk.store(p, bytearray(1200))
        (entry,) = [e for e in disk.entries() if e.tokens[0] == p[0]]
        os.utime(entry.path, (1_000_000 + age, 1_000_000 + age))  # 0 oldest, 2 newest
    first = disk.find(prompts[0], have=0)
    assert first is not None and disk.load(first[0]) is not None  # a restore: used now
    disk.store(prompts[3], bytearray(1200))
    held = sorted(e.tokens[0] for e in disk.entries())
    assert held == [0, 2000, 3000]  # the least recently used (1000) left
    assert disk.nbytes <= disk.limit


def test_a_full_disk_drops_the_state_with_a_note_and_leaves_no_temporary_file(
    tmp_path, monkeypatch
):
    disk, notes = cache(tmp_path)
    real_replace = os.replace

    def full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert disk.store(A, bytearray(100)) == 0
    monkeypatch.setattr(os, "replace", real_replace)
    assert files(tmp_path) == []
    assert len(notes) == 1 and "No space left on device" in notes[0]


def test_a_temporary_file_is_never_taken_for_a_state(tmp_path):
    disk, _ = cache(tmp_path)
    disk.store(A, bytearray(10))
    (path,) = tmp_path.iterdir()
    (tmp_path / f".{path.name}.999.1.tmp").write_bytes(path.read_bytes()[:50])
    assert [e.path for e in disk.entries()] == [path]


def test_the_ram_tier_writes_through_to_disk_and_a_new_process_finds_it(tmp_path):
    ram = PromptCache(limit=1 << 20, disk=DiskCache(tmp_path, KEY))
    ram.put(A, bytearray(b"x" * 300))
    ram.flush()
    after_restart = PromptCache(limit=1 << 20, disk=DiskCache(tmp_path, KEY))
    found = after_restart.take(A + [5] * 40, have=0)
    assert found is not None and found[1] == "disk" and found[0].state == b"x" * 300
    # A disk file stays for the next process; a RAM state would have left the cache.
    assert after_restart.take(A + [5] * 40, have=0) is not None


WRITER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from localfab.engine.disk_cache import DiskCache, StateKey
    key = StateKey({"name": "m.gguf", "size": 1, "sha256_ends": "ab"}, {"type_k": "f16"})
    disk = DiskCache(Path(sys.argv[1]), key, limit=8 << 20, note=lambda t: print(t, flush=True))
    for i in range(int(sys.argv[2])):
        disk.store(list(range(i % 5, i % 5 + 100 + i)), bytearray(os.urandom(400_000)))
    """
)


def test_two_processes_sharing_the_folder_never_read_a_half_written_file(tmp_path):
    # One process writes states (and evicts) while this one looks them up and loads them: a
    # reader sees whole files or none, so no load is ever discarded as corrupt.
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), "60"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    disk, notes = cache(tmp_path, limit=8 << 20)
    loads = 0
    deadline = time.monotonic() + 120
    while (writer.poll() is None or loads == 0) and time.monotonic() < deadline:
        for entry in disk.entries():
            loaded = disk.load(entry)
            loads += loaded is not None
    out, _ = writer.communicate()
    assert writer.returncode == 0 and out == ""
    assert notes == [] and loads > 0
    assert all(n.endswith(SUFFIX) for n in files(tmp_path))


def test_with_slack_a_file_missing_only_the_last_tokens_counts_as_written(tmp_path):
    # A chat gone idle is written again only once it grew by more than the slack.
    cache = PromptCache(limit=0, disk=DiskCache(tmp_path, KEY))
    assert cache.store(A, bytearray(10)) > 0
    longer = A + list(range(5000, 5100))  # 100 tokens more
    assert not cache.on_disk(longer)
    assert cache.on_disk(longer, slack=100) and not cache.on_disk(longer, slack=99)


def rewrite_header(path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    """Give `path` a header changed by `change` (the rest of the file as it was)."""
    raw = path.read_bytes()
    start = len(MAGIC) + 4
    (n,) = struct.unpack("<I", raw[len(MAGIC) : start])
    header = json.loads(raw[start : start + n])
    change(header)
    new = json.dumps(header).encode()
    path.write_bytes(raw[: len(MAGIC)] + struct.pack("<I", len(new)) + new + raw[start + n :])


HEADER_DAMAGE: dict[str, Callable[[dict[str, Any]], object]] = {
    "negative state_bytes": lambda h: h.update(state_bytes=-1),
    "state_bytes 10^13": lambda h: h.update(state_bytes=10**13),
    "state_bytes a string": lambda h: h.update(state_bytes="4000"),
    "state_bytes true": lambda h: h.update(state_bytes=True),
    "no sha256": lambda h: h.pop("sha256"),
    "sha256 a number": lambda h: h.update(sha256=7),
    "negative n_tokens": lambda h: h.update(n_tokens=-5),
    "n_tokens a string": lambda h: h.update(n_tokens="two hundred"),
    "no version": lambda h: h.pop("version"),
}


@pytest.mark.parametrize("damage", sorted(HEADER_DAMAGE))
def test_a_damaged_header_is_a_bad_file_never_an_error(tmp_path, damage):
    disk, _ = cache(tmp_path)
    disk.store(A, bytearray(os.urandom(4000)))
    (path,) = tmp_path.iterdir()
    whole = DiskEntry(path, tuple(A), path.stat().st_size)
    rewrite_header(path, HEADER_DAMAGE[damage])
    fresh, notes = cache(tmp_path)
    assert fresh.load(whole) is None  # asked for it directly (found before it was damaged)
    assert fresh.find(A + [1, 2], have=0) is None
    assert len(notes) == 1 and path.name in notes[0] and "\n" not in notes[0]
    assert not path.exists()
    # The cache goes on working: a new state is stored and found.
    assert fresh.store(A, bytearray(100)) > 0 and fresh.find(A + [1], have=0) is not None


@pytest.mark.parametrize(
    "raw_header",
    [b"[" * 200_000, b"[1, 2]", b'"text"', b"\xff\xfe", b"{}"],
    ids=["nested 200000 deep", "a list", "a string", "not utf-8", "empty object"],
)
def test_a_header_that_is_not_a_json_object_of_ours_is_a_bad_file(tmp_path, raw_header):
    disk, notes = cache(tmp_path)
    path = tmp_path / f"{KEY.id}-junk{SUFFIX}"
    raw = MAGIC + struct.pack("<I", len(raw_header)) + raw_header + b"\0" * 64
    path.write_bytes(raw)
    assert disk.find(A, have=0) is None
    assert len(notes) == 1 and not path.exists()
    path.write_bytes(raw)
    assert disk.load(DiskEntry(path, tuple(A), len(raw))) is None  # asked for it directly
    assert len(notes) == 2 and not path.exists()


def _release(fifo: Path) -> None:
    """Open `fifo` for writing (and close it) so that a reader blocked on it goes on."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_pipe_named_like_a_state_file_is_skipped_without_waiting(tmp_path):
    disk, notes = cache(tmp_path)
    disk.store(A, bytearray(100))
    fifo = tmp_path / f"{KEY.id}-{'0' * 20}{SUFFIX}"
    os.mkfifo(fifo)
    found: list[object] = []
    worker = threading.Thread(target=lambda: found.append(disk.find(A + [1], have=0)), daemon=True)
    worker.start()
    worker.join(10)
    blocked = worker.is_alive()
    _release(fifo)
    assert not blocked, "the lookup waited on the pipe"
    assert found and found[0] is not None  # the real file is still found
    disk.find(A + [1], have=0)  # a second scan says nothing new
    assert len(notes) == 1 and fifo.name in notes[0] and "regular" in notes[0]
    assert disk.load(DiskEntry(fifo, tuple(A), 0)) is None  # asked for it directly
    assert fifo.exists()  # not ours to remove


def test_thousands_of_junk_files_make_one_line_not_thousands(tmp_path):
    n = 20_000
    for i in range(n):
        (tmp_path / f"{KEY.id}-junk{i:05d}{SUFFIX}").write_bytes(b"junk")
        if i % 4 == 0:  # and others' files, which are none of this cache's business
            (tmp_path / f"{OTHER.id}-x{i:05d}{SUFFIX}").write_bytes(b"junk")
    disk, notes = cache(tmp_path)
    assert disk.find(A, have=0) is None
    assert len(notes) == 1 and str(n) in notes[0], notes[:3]
    assert len(files(tmp_path)) == n // 4  # the damaged ones of this key are gone
