"""The prompt cache's disk tier: state files found by prefix, checked whole, bounded, crash-safe,
and shared by processes. The states here are stand-in bytes; `test_state` restores real ones."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from localfab.engine.disk_cache import SUFFIX, DiskCache, StateKey
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
