"""Stacked memory bars: what a plan puts on each device (weights, KV, compute, reserve, free)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.color import Color
from textual.widget import Widget

from localfab.plan import DeviceMemory
from localfab.units import format_bytes

# (field, label, theme variable, glyph) in the order the bar stacks them.
PARTS: tuple[tuple[str, str, str, str], ...] = (
    ("weights", "weights", "primary", "█"),
    ("kv", "KV", "secondary", "█"),
    ("compute", "compute", "warning", "█"),
    ("reserve", "reserve", "accent", "█"),
)
FREE = ("free", "free", "foreground-muted", "░")


def segment_widths(memory: DeviceMemory, width: int) -> list[tuple[str, int]]:
    """Cells for each part of the bar, free last; the cells always add up to `width`.

    The bar's scale is the device's available memory, or the plan's total when it asks for more
    (a plan that does not fit fills the bar). A part that is not zero gets at least one cell.
    """
    sizes = [(name, max(0, getattr(memory, name))) for name, *_ in PARTS]
    sizes.append(("free", max(0, memory.free_left)))
    scale = max(memory.available, memory.total, 1)
    cells = [(name, max(1, round(size / scale * width)) if size > 0 else 0) for name, size in sizes]
    over = sum(c for _, c in cells) - width
    # Take or give the rounding difference from the largest part, so the bar never wraps.
    while over != 0 and width > 0:
        i = max(range(len(cells)), key=lambda k: cells[k][1])
        name, c = cells[i]
        step = -1 if over > 0 else 1
        cells[i] = (name, max(0, c + step))
        over += step
    return cells


class MemoryBars(Widget):
    """One stacked bar per device with its byte figures, and a legend."""

    DEFAULT_CSS = """
    MemoryBars {
        height: auto;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.memory: tuple[DeviceMemory, ...] = ()

    def on_mount(self) -> None:
        # The bars take their colours from the theme: redraw them when it changes.
        self.watch(self.app, "theme", self._theme_changed, init=False)

    def _theme_changed(self) -> None:
        self.refresh()

    def show(self, memory: Sequence[DeviceMemory]) -> None:
        self.memory = tuple(memory)
        self.refresh(layout=True)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return 1 + 4 * len(self.memory) if self.memory else 1

    def _colours(self) -> dict[str, str]:
        """Each part's colour from the theme, made opaque over the background."""
        variables = self.app.get_css_variables()
        background = Color.parse(variables.get("background", "black"))
        out = {}
        for name, _, var, _ in (*PARTS, FREE):
            colour = Color.parse(variables.get(var, variables.get("foreground", "white")))
            out[name] = (background + colour).hex
        return out

    def legend(self) -> Text:
        colours = self._colours()
        text = Text()
        for name, label, _, glyph in (*PARTS, FREE):
            text.append(glyph * 2, style=colours[name])
            text.append(f" {label}  ")
        return text

    def render(self) -> Text:
        width = max(10, self.content_region.width or self.size.width)
        colours = self._colours()
        glyphs = {name: glyph for name, _, _, glyph in (*PARTS, FREE)}
        text = self.legend()
        for m in self.memory:
            where = "CPU (system RAM)" if m.kind == "cpu" else m.device
            used = f"{format_bytes(m.total)} of {format_bytes(m.available)}"
            state = (
                f"{format_bytes(m.free_left)} free"
                if m.free_left >= 0
                else f"short by {format_bytes(-m.free_left)}"
            )
            text.append(f"\n\n{where}: {used} · {state}\n", style="bold")
            for name, cells in segment_widths(m, width):
                text.append(glyphs[name] * cells, style=colours[name])
            figures = " · ".join(
                f"{label} {format_bytes(getattr(m, name))}"
                for name, label, _, _ in PARTS
                if getattr(m, name) > 0
            )
            text.append(f"\n{figures}")
        return text
