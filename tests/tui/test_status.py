"""The status bar: live figures repaint without laying out the screen when their width holds."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Label

from localfab.tui.widgets.status import StatusBar

pytestmark = pytest.mark.anyio


class Harness(App[None]):
    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")


async def test_a_figure_as_wide_as_the_last_is_repainted_without_a_layout_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = Harness()
    async with app.run_test(size=(100, 3)) as pilot:
        bar = app.query_one(StatusBar)
        bar.show_speed(420.0, 65.3)
        await pilot.pause()
        layouts: list[str] = []
        original = Label.refresh

        def refresh(self: Label, *regions: object, layout: bool = False, **kw: object) -> object:
            if layout and self.id:
                layouts.append(self.id)
            return original(self, *regions, layout=layout, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(Label, "refresh", refresh)
        bar.show_speed(430.0, 66.1)  # same widths: "TTFT 430 ms", "66.1 tok/s"
        assert layouts == []
        bar.show_speed(1250.0, 166.1)  # wider: the bar is laid out again
        assert sorted(layouts) == ["status-speed", "status-ttft"]
        await pilot.pause()
        speed = app.query_one("#status-speed", Label)
        assert str(speed.render()) == "166.1 tok/s"
        assert speed.size.width == len("166.1 tok/s")  # laid out at its new width
