"""Streaming fidelity: however a reply is cut into chunks, the screen ends as a fresh render.

The reply holds code fences, a table and Chinese text; chunks are cut at random byte offsets
(mid-fence, mid-row, mid-character), decoded incrementally as a byte stream must be, grouped
into frames as the chat screen does, and appended to a streaming message.
"""

from __future__ import annotations

import codecs
import random

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll

from localfab.tui.widgets.messages import MessageView

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


async def render(app: Harness, pilot, view: MessageView) -> str:
    await pilot.pause()
    return app.export_screenshot()


async def test_any_chunking_ends_as_a_fresh_render():
    rng = random.Random(20261130)
    app = Harness()
    covered: set[str] = set()
    async with app.run_test(size=(90, 70)) as pilot:
        log = app.query_one("#log")
        fresh = MessageView("assistant", REPLY)
        await log.mount(fresh)
        expected = await render(app, pilot, fresh)
        await fresh.remove()
        for _ in range(CHUNKINGS):
            pieces = chunks(REPLY.encode(), rng)
            covered |= cut_points_cover_the_hard_places(pieces)
            view = MessageView("assistant")
            await log.mount(view)
            view.start_stream()
            decoder = codecs.getincrementaldecoder("utf-8")()
            frame: list[str] = []
            for piece in pieces:
                frame.append(decoder.decode(piece))
                # A frame holds whatever arrived since the last one: one to five chunks.
                if rng.random() < 0.4:
                    await view.write("".join(frame))
                    frame = []
            frame.append(decoder.decode(b"", final=True))
            await view.write("".join(frame))
            await view.end_stream()
            assert view.text == REPLY
            assert view.markdown.source == REPLY
            assert await render(app, pilot, view) == expected
            await view.remove()
    assert covered == {"fence", "row", "char"}


async def test_resizing_mid_stream_does_not_duplicate_lines():
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
        streamed = await render(app, pilot, view)
        await view.remove()
        fresh = MessageView("assistant", REPLY)
        await log.mount(fresh)
        assert await render(app, pilot, fresh) == streamed
