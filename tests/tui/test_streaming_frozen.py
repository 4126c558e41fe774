"""A long streaming reply freezes its finished blocks into segments and still renders as one.

Frozen segments are never re-rendered; the open segment takes the new text. Whatever the
chunking and wherever the cuts fall (between headings, quotes, lists, rules, tables, code
fences), the final screen equals a fresh render of the whole text, and the source read back
across the segments is the text that was written.
"""

from __future__ import annotations

import random

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets.markdown import MarkdownFence

from localfab.tui.widgets import messages
from localfab.tui.widgets.messages import MessageView, ParkedSegment
from tests.screen_compare import assert_same_screen, settled, steady
from tests.tui.test_streaming import REPLY, chunks, frames
from tests.tui_support import wait_for

pytestmark = pytest.mark.anyio

# Every kind of block, with the margins that make some cuts unsafe (a heading's top margin).
MIXED = """# Lighthouse log

The keeper wrote a line each night.

## Night one

- trimmed the wick
- wound the clock

1. first
2. second

> Fog until dawn.

---

```text
12:00 lamp lit
```

| hour | wind |
|-----:|------|
| 1 | NE |

### Night two

Calm sea, 平静的海面。

"""

LONG = (MIXED + REPLY + "\n") * 2


class Harness(App[None]):
    CSS = "MessageView { height: auto; }"

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="log")


async def stream(view: MessageView, text: str, rng: random.Random) -> None:
    view.start_stream()
    for frame in frames(chunks(text.encode(), rng), rng):
        await view.write(frame)
    await view.end_stream()


@pytest.mark.slow  # a long reply streamed twice for each setting
@pytest.mark.parametrize("freeze_after", [1, messages.FREEZE_AFTER])
async def test_a_long_reply_freezes_segments_and_ends_as_a_fresh_render(
    monkeypatch: pytest.MonkeyPatch, freeze_after: int
) -> None:
    monkeypatch.setattr(messages, "FREEZE_AFTER", freeze_after)
    app = Harness()
    async with app.run_test(size=(90, 260)) as pilot:
        log = app.query_one("#log")
        fresh = MessageView("assistant", LONG)
        await log.mount(fresh)
        expected = await steady(pilot, app.export_screenshot)
        assert len(fresh.segments) == 1
        await fresh.remove()
        for seed in range(2):
            view = MessageView("assistant")
            await log.mount(view)
            await stream(view, LONG, random.Random(seed))
            # Finished blocks were frozen into segments of their own as the reply grew.
            assert len(view.parts) >= 3
            assert view.text == LONG
            assert view.markdown.source == LONG
            shot = await settled(pilot, app.export_screenshot, expected)
            assert_same_screen(shot, expected, f"chunking {seed}")
            await view.remove()


async def test_frozen_segments_are_not_rendered_again() -> None:
    app = Harness()
    async with app.run_test(size=(90, 60)) as pilot:
        log = app.query_one("#log")
        view = MessageView("assistant")
        await log.mount(view)
        view.start_stream()
        half = len(LONG) // 2
        await view.write(LONG[:half])
        await wait_for(pilot, lambda: len(view.segments) > 1)
        frozen = view.segments[:-1]
        blocks = {id(s): list(s.children) for s in frozen}
        await view.write(LONG[half:])
        await view.end_stream()
        # The same segments hold the same block widgets: nothing was re-parsed or re-mounted.
        for segment in frozen:
            assert segment.is_attached
            assert list(segment.children) == blocks[id(segment)]
        assert view.markdown.source == LONG


@pytest.mark.parametrize(
    "head, lines",
    [
        ("| a | b |\n|---|---|\n", [f"| {i} | {i * i} |\n" for i in range(6)]),
        ("- first\n", [f"- item {i}\n" for i in range(6)]),
    ],
    ids=["table", "list"],
)
async def test_a_block_still_open_when_its_segment_opens_keeps_growing_as_one(
    monkeypatch: pytest.MonkeyPatch, head: str, lines: list[str]
) -> None:
    # The cut falls just before the open block, which then takes its next lines in the new
    # segment: they must join it, not start a paragraph of their own.
    monkeypatch.setattr(messages, "FREEZE_AFTER", 1)
    text = "Before the table.\n\n" + head + "".join(lines)
    app = Harness()
    async with app.run_test(size=(60, 30)) as pilot:
        log = app.query_one("#log")
        fresh = MessageView("assistant", text)
        await log.mount(fresh)
        expected = await steady(pilot, app.export_screenshot)
        expected_kinds = [type(b).__name__ for b in fresh.markdown.children]
        await fresh.remove()
        view = MessageView("assistant")
        await log.mount(view)
        view.start_stream()
        for piece in ["Before the table.\n\n" + head, *lines]:
            await view.write(piece)
            await pilot.pause()
        await view.end_stream()
        assert len(view.segments) == 2
        assert [type(b).__name__ for b in view.markdown.children] == expected_kinds
        shot = await settled(pilot, app.export_screenshot, expected)
        assert_same_screen(shot, expected, "the block that grew across the cut")


async def test_code_blocks_and_tables_stay_whole_across_segments() -> None:
    app = Harness()
    async with app.run_test(size=(90, 260)) as pilot:
        log = app.query_one("#log")
        view = MessageView("assistant")
        await log.mount(view)
        await stream(view, LONG, random.Random(3))
        await pilot.pause()
        kinds = [type(b).__name__ for b in view.markdown.children]
        assert kinds.count("MarkdownFence") == 6  # three per copy
        assert kinds.count("ReplyTable") == 4
        # Each code block copies byte-exact from whichever segment holds it.
        fences = list(view.query(MarkdownFence))
        assert view.code_of(fences[0]) == "12:00 lamp lit\n"
        assert view.code_of(fences[1]).startswith("import time\n\ndef tok_s(")


@pytest.mark.slow  # a long reply painted frame by frame
async def test_segments_far_from_the_view_are_parked_and_come_back_when_scrolled_to() -> None:
    app = Harness()
    async with app.run_test(size=(90, 30)) as pilot:
        log = app.query_one("#log")
        fresh = MessageView("assistant", LONG)
        await log.mount(fresh)
        await pilot.pause()
        log.scroll_end(animate=False)
        expected_end = await steady(pilot, app.export_screenshot)
        log.scroll_home(animate=False)
        expected_top = await steady(pilot, app.export_screenshot)
        await fresh.remove()

        view = MessageView("assistant")
        await log.mount(view)
        log.anchor()
        view.start_stream()
        rng = random.Random(11)
        # Stream as the chat screen does: a frame's text at a time, each frame painted. The
        # frames are those of a fast model (four of the usual frames in each), so that the
        # reply grows past the view in a few paints.
        small = frames(chunks(LONG.encode(), rng), rng)
        for i in range(0, len(small), 4):
            await view.write("".join(small[i : i + 4]))
            await pilot.pause()
        await view.end_stream()
        await pilot.pause()
        # The blocks that scrolled far away were parked, text kept; parked segments next to
        # each other merged into one widget (the whole far past here: a few thousand chars).
        assert len(LONG) < messages.PARK_MERGE_CHARS
        assert len(view.query(ParkedSegment)) == 1
        assert view.markdown.source == LONG
        log.scroll_end(animate=False)
        shot = await settled(pilot, app.export_screenshot, expected_end)
        assert_same_screen(shot, expected_end, "the end of the reply")
        # Scrolled back to the top, the parked segments there turn back into Markdown.
        log.scroll_home(animate=False)
        shot = await settled(pilot, app.export_screenshot, expected_top, seconds=30)
        assert_same_screen(shot, expected_top, "the top of the reply")
        assert view.markdown.source == LONG
