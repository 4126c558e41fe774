"""Every command names a path that is not a regular file for what it is, and never blocks on it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from localfab.errors import ModelError, ModelNotFound
from localfab.gguf.facts import read_facts
from localfab.gguf.modelfile import check_gguf_file
from localfab.store.files import existing_file
from tests.conftest import LOCALFAB


@pytest.fixture()
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    os.mkfifo(path)
    return path


@pytest.fixture()
def device_link(tmp_path: Path) -> Path:
    path = tmp_path / "null.gguf"
    path.symlink_to("/dev/null")
    return path


def test_the_shared_checks_name_fifos_and_devices(fifo: Path, device_link: Path, tmp_path: Path):
    with pytest.raises(ModelError, match=r"not a regular file \(it is a named pipe"):
        existing_file(fifo)
    with pytest.raises(ModelError, match=r"not a regular file \(it is a character device"):
        check_gguf_file(device_link)
    with pytest.raises(ModelNotFound, match="does not exist"):
        existing_file(tmp_path / "nope.gguf")
    text = tmp_path / "text.gguf"
    text.write_bytes(b"hello")
    with pytest.raises(ModelError, match="not a GGUF file"):
        check_gguf_file(text)


@pytest.mark.parametrize("content", [b"hello, not a model", b"GG", b""])
def test_engine_and_header_reader_say_not_gguf_the_same_way(tmp_path: Path, content: bytes):
    path = tmp_path / "notes.gguf"
    path.write_bytes(content)
    messages = []
    for read in (check_gguf_file, read_facts):
        with pytest.raises(ModelError) as info:
            read(path)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"{path} is not a GGUF file (")
    assert "give the path of a GGUF model" in messages[0]
    if content.startswith(b"hell"):
        assert "it starts with b'hell', not b'GGUF'" in messages[0]
    else:
        assert f"it is only {len(content)} bytes long" in messages[0]


@pytest.mark.parametrize(
    "args",
    [["show"], ["plan"], ["add"], ["run"], ["serve"]],
    ids=["show", "plan", "add", "run", "serve"],
)
def test_commands_name_a_fifo_instead_of_blocking_or_calling_it_missing(
    args: list[str], fifo: Path, lf_env: dict[str, str]
):
    cmd = [str(LOCALFAB), args[0], str(fifo)]
    if args[0] == "run":
        cmd.append("Hi")
    out = subprocess.run(cmd, capture_output=True, text=True, env=lf_env, timeout=60)
    assert out.returncode == 3, out.stderr
    assert "is not a regular file (it is a named pipe (FIFO))" in out.stderr
    assert "Traceback" not in out.stderr


class UnsizedSource:
    """A remote file whose server does not say how long it is: only a short read tells."""

    label = "https://example.test/short.gguf"

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, offset: int, size: int) -> bytes:
        return self.data[offset : offset + size]

    def size(self) -> int | None:
        return None


def test_a_short_remote_file_of_unknown_size_is_not_gguf_either() -> None:
    with pytest.raises(ModelError) as info:
        read_facts(UnsizedSource(b"GG"))
    assert str(info.value).startswith(
        "https://example.test/short.gguf is not a GGUF file (it is only 2 bytes long): give"
    )
