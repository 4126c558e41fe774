"""Streaming fidelity: however a reply is cut into chunks, the screen ends as a fresh render.

The reply holds code fences, a table and Chinese text; chunks are cut at random byte offsets
(mid-fence, mid-row, mid-character), decoded incrementally as a byte stream must be, grouped
into frames as the chat screen does, and appended to a streaming message. Every chunking is
compared with a fresh render widget by widget (the kind, classes and styled content of each);
one in 25 is also painted frame by frame and compared on screen.
"""

from __future__ import annotations

import codecs
import random
from functools import partial

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content, Span
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Markdown, Static

from localfab.tui.widgets.messages import MessageView
from localfab.tui.widgets.reply_markdown import ReplyTable
from tests.screen_compare import assert_same_screen, settled, steady

pytestmark = pytest.mark.anyio

REPLY = """Sure: here is how to **measure** decode speed.

```python
import time

def tok_s(n: int, seconds: float) -> float:
    return n / seconds  # tokens per second
```

| model | quant | tok/s | 备注 |
|:------|:-----:|------:|------|
| gemma3:270m | Q4_K_M | 182.5 | 测试模型 |
| qwen3:4b | Q4_K_M | 31.0 | 中文很好 |

中文段落：本地运行大语言模型，解码速度受内存带宽限制。每个词元都要读取全部权重。

- first item with `inline code`
- second item

```
plain fence with | pipes | and ``` inside text
```

> A quote at the end, then a last line.
"""

CHUNKINGS = 200
# The chunkings run as this many tests of their own, so that a parallel run can spread them.
GROUPS = 4
# One chunking in 25 is painted frame by frame, as the chat screen paints it, and compared with
# the fresh render on screen; every chunking is compared with it widget by widget.
PAINT_EVERY = 25


class Harness(App[None]):
    CSS = "MessageView { height: auto; }"

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="log")


def chunks(data: bytes, rng: random.Random) -> list[bytes]:
    """Cut `data` at random byte offsets: pieces of 1 to 40 bytes."""
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 40)
        out.append(data[i : i + n])
        i += n
    return out


def frames(pieces: list[bytes], rng: random.Random) -> list[str]:
    """Decode `pieces` as a byte stream must be (a character cut in two waits for its end) and
    group them as the chat screen does: a frame holds whatever arrived since the last one."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    out: list[str] = []
    frame: list[str] = []
    for piece in pieces:
        frame.append(decoder.decode(piece))
        if rng.random() < 0.4:
            out.append("".join(frame))
            frame = []
    frame.append(decoder.decode(b"", final=True))
    out.append("".join(frame))
    return out


def cut_points_cover_the_hard_places(pieces: list[bytes]) -> set[str]:
    """Which hard places this chunking cuts through (mid-fence, mid-row, mid-character)."""
    seen: set[str] = set()
    pos = 0
    for piece in pieces[:-1]:
        pos += len(piece)
        before = REPLY.encode()[:pos]
        line = before.rsplit(b"\n", 1)[-1]
        if before.count(b"```") % 2 == 1:
            seen.add("fence")
        if line.startswith(b"|") and line.count(b"|") < 5:
            seen.add("row")
        try:
            before.decode()
        except UnicodeDecodeError:
            seen.add("char")
    return seen


Shown = tuple[str, tuple[str, ...], str, tuple[Span, ...]]


def shown(node: Widget) -> Shown:
    """What one widget shows: its kind, its classes and its content with the content's styles."""
    visual: object = None  # a container: what it holds is compared widget by widget
    if isinstance(node, ReplyTable):  # draws itself from its cells
        cells = [*node.headers, *(cell for row in node.rows for cell in row)]
        text = repr(([h.plain for h in node.headers], [[c.plain for c in r] for r in node.rows]))
        spans = tuple(span for cell in cells for span in cell.spans)
        return "ReplyTable", tuple(sorted(node.classes)), text + repr(node.aligns), spans
    if isinstance(node, Static):
        visual = node.visual
    elif type(node).render is not Widget.render:  # a widget that draws its own content
        visual = node.render()
    if isinstance(visual, Content):
        text, spans = visual.plain, tuple(visual.spans)
    else:
        text, spans = repr(visual), ()
    return type(node).__name__, tuple(sorted(node.classes)), text, spans


def widget_render(view: MessageView) -> list[Shown]:
    """The message rendered widget by widget, read across its segments (a reply that froze
    blocks into segments of their own shows the same blocks as one that did not)."""
    return [shown(node) for node in view.walk_children(Widget) if not isinstance(node, Markdown)]


async def stream(view: MessageView, text: list[str], pilot: Pilot[None] | None = None) -> None:
    """Stream `text` into `view` a frame at a time; with `pilot`, each frame is painted."""
    view.start_stream()
    for frame in text:
        await view.write(frame)
        if pilot is not None:
            await pilot.pause()
    await view.end_stream()


@pytest.mark.slow  # 200 replies streamed through the real widget
@pytest.mark.parametrize("group", range(GROUPS))
async def test_any_chunking_ends_as_a_fresh_render(group: int) -> None:
    rng = random.Random(20261130 + group)
    app = Harness()
    covered: set[str] = set()
    async with app.run_test(size=(90, 70)) as pilot:
        log = app.query_one("#log")
        fresh = MessageView("assistant", REPLY)
        await log.mount(fresh)
        expected_screen = await steady(pilot, app.export_screenshot)
        expected = await steady(pilot, partial(widget_render, fresh))
        await fresh.remove()
        for i in range(CHUNKINGS // GROUPS):
            pieces = chunks(REPLY.encode(), rng)
            covered |= cut_points_cover_the_hard_places(pieces)
            text = frames(pieces, rng)
            view = MessageView("assistant")
            if i % PAINT_EVERY == 0:
                await log.mount(view)
                await stream(view, text, pilot)
                shot = await settled(pilot, app.export_screenshot, expected_screen)
                assert_same_screen(shot, expected_screen, f"chunking {i}")
            else:
                # The same widget work without painting the frames in between: the screen
                # holds its paint until the message is removed again.
                with app.batch_update():
                    await log.mount(view)
                    await stream(view, text)
            assert view.text == REPLY
            assert view.markdown.source == REPLY
            rendered = await settled(pilot, partial(widget_render, view), expected)
            assert rendered == expected, f"chunking {i}"
            with app.batch_update():
                await view.remove()
    assert covered == {"fence", "row", "char"}


async def test_resizing_mid_stream_does_not_duplicate_lines() -> None:
    rng = random.Random(7)
    app = Harness()
    async with app.run_test(size=(100, 70)) as pilot:
        log = app.query_one("#log")
        view = MessageView("assistant")
        await log.mount(view)
        view.start_stream()
        pieces = chunks(REPLY.encode(), rng)
        decoder = codecs.getincrementaldecoder("utf-8")()
        for i, piece in enumerate(pieces):
            await view.write(decoder.decode(piece))
            if i == len(pieces) // 3:
                await pilot.resize_terminal(80, 70)
            if i == 2 * len(pieces) // 3:
                await pilot.resize_terminal(90, 70)
        await view.end_stream()
        streamed = await steady(pilot, app.export_screenshot)
        await view.remove()
        fresh = MessageView("assistant", REPLY)
        await log.mount(fresh)
        assert_same_screen(await settled(pilot, app.export_screenshot, streamed), streamed)
