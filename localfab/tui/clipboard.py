"""Copying text out of the app: the terminal's clipboard (OSC 52) and the system clipboard.

OSC 52 is an escape sequence the terminal may or may not honour, and it never answers, so a copy
that went only that way is reported as "sent to the terminal's clipboard", never as "copied".
A system clipboard tool that exits cleanly is the only proof of a copy the app can get.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# System clipboard tools, tried in order: Wayland, X11 (two tools), macOS.
CLIPBOARD_TOOLS: tuple[tuple[str, ...], ...] = (
    ("wl-copy",),
    ("xclip", "-selection", "clipboard"),
    ("xsel", "-b"),
    ("pbcopy",),
)
TOOL_TIMEOUT = 3.0


@dataclass(frozen=True)
class CopyResult:
    """How a copy went: the system tool that took the text (None: none did), and why not."""

    tool: str | None
    problem: str = ""

    def message(self, what: str, size: int) -> tuple[str, str]:
        """The notification for this copy of `what` (`size` characters), and its severity."""
        if self.tool is not None:
            return f"Copied {what} ({size} characters, {self.tool}).", "information"
        why = self.problem or "no system clipboard tool (wl-copy, xclip, xsel, pbcopy) was found"
        return (
            f"Sent {what} to the terminal's clipboard (OSC 52); it pastes only if your "
            f"terminal allows OSC 52 ({why}).",
            "warning",
        )


def system_copy(
    text: str,
    *,
    tools: Sequence[Sequence[str]] = CLIPBOARD_TOOLS,
    which: Callable[[str], str | None] = shutil.which,
) -> CopyResult:
    """Give `text` byte-exact to the first system clipboard tool on PATH that accepts it.

    Blocks for as long as the tool takes (a few ms, up to `TOOL_TIMEOUT`): call it in a worker.
    """
    problems: list[str] = []
    data = text.encode("utf-8")
    for tool in tools:
        exe = which(tool[0])
        if exe is None:
            continue
        try:
            subprocess.run(
                [exe, *tool[1:]],
                input=data,
                check=True,
                timeout=TOOL_TIMEOUT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except subprocess.CalledProcessError as exc:
            problems.append(f"{tool[0]} failed with exit code {exc.returncode}")
            continue
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{tool[0]} failed: {type(exc).__name__}")
            continue
        return CopyResult(tool[0])
    return CopyResult(None, "; ".join(problems))


def code_blocks(markdown: str) -> list[str]:
    """The code blocks of a Markdown text, in order, exactly as written between their fences.

    The Markdown widget strips each block's trailing whitespace for display; a copy keeps it.
    """
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("gfm-like").parse(markdown)
    return [t.content for t in tokens if t.type in ("fence", "code_block")]
