"""Copying a reply or a code block: byte-exact, and never a false "copied"."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from localfab.tui.clipboard import CopyResult, code_blocks, system_copy
from tests.fake_engine import SAMPLE_REPLY, FakeEngine
from tests.tui_support import build_app, finished, loaded, send, wait_for

pytestmark = pytest.mark.anyio

# Two code blocks; the first ends in spaces and a blank line that the screen does not show.
TWO_BLOCKS = (
    "First:\n\n```sh\necho 'a  b'\t\nls -l   \n\n```\n\nThen:\n\n"
    "```python\nprint('中文')\n```\n\nDone.\n"
)
FIRST_BLOCK = "echo 'a  b'\t\nls -l   \n\n"
LAST_BLOCK = "print('中文')\n"


def fake_tool(folder: Path, name: str, *, exit_code: int = 0) -> Path:
    """A clipboard tool on PATH that stores what it is given in `folder/<name>.out`."""
    folder.mkdir(exist_ok=True)
    out = folder / f"{name}.out"
    tool = folder / name
    tool.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"open({str(out)!r}, 'wb').write(sys.stdin.buffer.read())\n"
        f"sys.exit({exit_code})\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return out


@pytest.fixture()
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH holds only this folder: no real clipboard tool is found."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    return folder


def messages(app) -> list[str]:
    return [n.message for n in app._notifications]


async def copy_notice(pilot, app) -> str:
    await wait_for(pilot, lambda: any("Copied" in m or "OSC 52" in m for m in messages(app)))
    return next(m for m in messages(app) if "Copied" in m or "OSC 52" in m)


async def test_ctrl_y_copies_the_last_reply_byte_exact_through_the_system_tool(history, bin_dir):
    out = fake_tool(bin_dir, "xclip")
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "hi")
        await finished(pilot, app)
        assert app.focused is app.chat.query_one("#prompt")  # the key works from the prompt box
        await pilot.press("ctrl+y")
        notice = await copy_notice(pilot, app)
        assert notice.startswith("Copied the last reply") and "xclip" in notice
        assert app.clipboard == SAMPLE_REPLY  # what went out as OSC 52
        assert out.read_bytes() == SAMPLE_REPLY.encode("utf-8")


async def test_without_a_clipboard_tool_it_says_sent_to_the_terminal_not_copied(history, bin_dir):
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "hi")
        await finished(pilot, app)
        await pilot.press("ctrl+y")
        notice = await copy_notice(pilot, app)
        assert "terminal's clipboard (OSC 52)" in notice
        assert not any(m.startswith("Copied") for m in messages(app))
        assert app.clipboard == SAMPLE_REPLY


async def test_a_failing_tool_is_not_reported_as_a_copy(history, bin_dir):
    fake_tool(bin_dir, "wl-copy", exit_code=1)  # e.g. no Wayland display
    out = fake_tool(bin_dir, "xsel")
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "hi")
        await finished(pilot, app)
        await pilot.press("ctrl+y")
        notice = await copy_notice(pilot, app)
        # wl-copy failed, so the next tool took it.
        assert notice.startswith("Copied") and "xsel" in notice
        assert out.read_bytes() == SAMPLE_REPLY.encode("utf-8")


async def test_ctrl_g_copies_the_last_code_block_with_its_exact_whitespace(history, bin_dir):
    out = fake_tool(bin_dir, "pbcopy")
    app, _ = build_app(history, engine=FakeEngine(lambda _p: TWO_BLOCKS))
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "code please")
        await finished(pilot, app)
        await pilot.press("ctrl+g")
        notice = await copy_notice(pilot, app)
        assert notice.startswith("Copied the code block")
        assert app.clipboard == LAST_BLOCK
        assert out.read_bytes() == LAST_BLOCK.encode("utf-8")


async def test_ctrl_g_copies_the_code_block_under_the_mouse(history, bin_dir):
    from textual.widgets.markdown import MarkdownFence

    app, _ = build_app(history, engine=FakeEngine(lambda _p: TWO_BLOCKS))
    async with app.run_test(size=(100, 40)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "code please")
        await finished(pilot, app)
        first = app.chat.query(MarkdownFence).first()
        assert first.code != FIRST_BLOCK  # the screen strips the end; the copy must not
        await pilot.hover(first)
        await pilot.press("ctrl+g")
        await copy_notice(pilot, app)
        assert app.clipboard == FIRST_BLOCK


async def test_copy_with_nothing_to_copy_says_so(history, bin_dir):
    app, _ = build_app(history)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await pilot.press("ctrl+y")
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert "There is no reply to copy yet." in messages(app)
        assert "There is no code block to copy." in messages(app)
        assert app.clipboard == ""


def test_code_blocks_keep_the_source_exactly() -> None:
    assert code_blocks(TWO_BLOCKS) == [FIRST_BLOCK, LAST_BLOCK]
    assert code_blocks("no code here") == []


def test_system_copy_tries_tools_in_order_and_reports_failures(bin_dir) -> None:
    fake_tool(bin_dir, "wl-copy", exit_code=3)
    result = system_copy("x")
    assert result.tool is None and "wl-copy failed with exit code 3" in result.problem
    text, severity = result.message("it", 1)
    assert "OSC 52" in text and "Copied" not in text and severity == "warning"
    assert CopyResult("xclip").message("it", 1)[0].startswith("Copied it")
    assert os.environ["PATH"] == str(bin_dir)
