"""The status bar: model, GPU layers, context gauge, live TTFT and tok/s, energy."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, Sparkline

from localfab.units import format_ms as duration

GAUGE_CELLS = 10


def compact(n: int) -> str:
    """1234 -> 1.2k; small numbers as they are."""
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 1000:
        return f"{n / 1000:.1f}k"
    return str(n)


def gauge(used: int, total: int, cells: int = GAUGE_CELLS) -> str:
    """A text gauge such as ▰▰▰▱▱▱▱▱▱▱."""
    if total <= 0:
        return "▱" * cells
    filled = min(cells, round(cells * used / total))
    if used > 0 and filled == 0:
        filled = 1
    return "▰" * filled + "▱" * (cells - filled)


NARROW = 96  # below this width the gauge and the sparkline shrink
REMOTE_CELLS = 24  # a remote server's name or URL is cut to this width


class StatusBar(Horizontal):
    """One line of facts about the model and the last reply."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._usage = (0, 0)

    def _put(self, label_id: str, text: str) -> Label:
        """Show `text` in a label; a text as wide as the last is repainted without a layout
        pass (which lays out the whole screen: twice per frame of a reply, for the live speed)."""
        label = self.query_one(f"#{label_id}", Label)
        old = label.content
        if old != text:
            label.update(text, layout=not isinstance(old, str) or cell_len(old) != cell_len(text))
        return label

    def compose(self) -> ComposeResult:
        yield Label("no model", id="status-model", markup=False)
        yield Label("", id="status-gpu", markup=False)
        yield Label("", id="status-ctx", markup=False)
        yield Label("TTFT —", id="status-ttft", markup=False)
        yield Label("", id="status-thought", markup=False)
        yield Label("— tok/s", id="status-speed", markup=False)
        yield Sparkline([], id="status-spark")
        yield Label("— J/tok", id="status-energy", markup=False)

    def show_model(
        self, name: str, gpu_layers: int | None, total_layers: int | None, remote: str = ""
    ) -> None:
        """The model's name, and where it runs: its layers on this machine's GPU, or the
        remote server's name (`remote`)."""
        self._put("status-model", name)
        if remote:
            where = remote if cell_len(remote) <= REMOTE_CELLS else remote[: REMOTE_CELLS - 1] + "…"
            self._put("status-gpu", f"@ {where}")
            return
        self._put("status-gpu", "" if total_layers is None else f"GPU {gpu_layers}/{total_layers}")

    def on_resize(self) -> None:
        self.set_class(self.size.width < NARROW, "narrow")
        self.show_context(*self._usage)

    def show_context(self, used: int, total: int) -> None:
        self._usage = (used, total)
        cells = GAUGE_CELLS if self.size.width >= NARROW else GAUGE_CELLS // 2
        text = f"ctx {gauge(used, total, cells)} {compact(used)}/{compact(total)}" if total else ""
        label = self._put("status-ctx", text)
        label.set_class(total > 0 and used / total > 0.9, "full")

    def show_speed(
        self, ttft_ms: float | None, tok_s: float | None, draft_acceptance: float | None = None
    ) -> None:
        ttft = "TTFT —" if ttft_ms is None else f"TTFT {duration(ttft_ms)}"
        speed = "— tok/s" if tok_s is None else f"{tok_s:,.1f} tok/s"
        if draft_acceptance is not None:  # speculative decoding: the share of drafts kept
            speed += f" (draft {draft_acceptance:.0%})"
        self._put("status-ttft", ttft)
        self._put("status-speed", speed)

    def show_thought(self, thought_ms: float | None) -> None:
        """How long the last reply thought before its answer (none: the label goes)."""
        label = self._put(
            "status-thought", "" if thought_ms is None else f"thought {duration(thought_ms)}"
        )
        label.display = thought_ms is not None

    def show_energy(self, joules_per_token: float | None) -> None:
        """The last reply's energy per token; a dash where this machine reports no power."""
        text = "— J/tok" if joules_per_token is None else f"{joules_per_token:.3g} J/tok"
        self._put("status-energy", text)

    def show_reply(
        self,
        ttft_ms: float,
        tok_s: float,
        draft_acceptance: float | None,
        joules_per_token: float | None,
    ) -> None:
        """A finished reply's figures: speed, energy and a sparkline sample."""
        self.show_speed(ttft_ms, tok_s, draft_acceptance)
        self.show_energy(joules_per_token)
        if tok_s > 0:
            self.add_speed_sample(tok_s)

    def add_speed_sample(self, tok_s: float) -> None:
        spark = self.query_one("#status-spark", Sparkline)
        spark.data = [*(spark.data or []), tok_s][-24:]
