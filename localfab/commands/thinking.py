"""`run` and a thinking model: the thought on stderr (dimmed on a terminal, or hidden), the
answer on stdout, and what a reply's template thinks in."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from localfab.engine.reasoning import ReasoningSplit, Thinking

DIM, RESET = "\x1b[2m", "\x1b[0m"

# The options `run` and `serve` share, with llama-server's names.
reasoning_option = click.option(
    "-rea",
    "--reasoning",
    type=click.Choice(["on", "off", "auto"]),
    default="auto",
    show_default=True,
    help="A thinking model's thinking, on or off through its template's enable_thinking "
    "(auto: the template's default).",
)


def template_file_option(*, exists: bool) -> Callable[[Any], Any]:
    return click.option(
        "--chat-template-file",
        type=click.Path(exists=exists, dir_okay=False, path_type=Path),
        default=None,
        help="Use this Jinja chat template instead of the model's (as llama-server).",
    )


def reply_thinking(prompts: Any, engine: Any, tokens: Sequence[int]) -> Thinking | None:
    """How the reply to `tokens` thinks: the template's tags, and whether the prompt's end
    opened the block (None: a template that does not think, or a built-in one)."""
    from localfab.chat.templates import template_thinking

    tail = engine.detokenize(list(tokens[-8:]), special=True)
    return template_thinking(prompts.template, tail)


def use_template_file(loaded: Any, path: Path | None) -> None:
    """--chat-template-file: the template in `path` instead of the model's (as llama-server);
    a note about the model's own template no longer applies."""
    if path is None:
        return
    from localfab.chat.prompt import PromptBuilder
    from localfab.errors import UsageError

    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the chat template file {path}: {exc}") from exc
    old = loaded.prompts.notice
    loaded.prompts = PromptBuilder(loaded.engine, source=source)
    loaded.notices = [n for n in loaded.notices if n != old]


def set_reasoning(prompts: Any, reasoning: str) -> None:
    """--reasoning on/off: the template's enable_thinking (auto: the template's default)."""
    if reasoning != "auto":
        prompts.variables["enable_thinking"] = reasoning == "on"


class ThoughtStream:
    """Writes a reply's text as it streams: the answer through `write_answer` (stdout), the
    thought to stderr, dimmed on a terminal, unless `hide`; without `thinking`, all of it is
    the answer."""

    def __init__(
        self,
        thinking: Thinking | None,
        write_answer: Callable[[str], None],
        *,
        hide: bool = False,
        shown: Callable[[str], str] = str,
    ) -> None:
        self.split = None if thinking is None else ReasoningSplit(thinking)
        self.write_answer = write_answer
        self.hide = hide
        self.shown = shown
        self.err = sys.stderr
        self._thought_open = False

    def write(self, text: str) -> None:
        if self.split is None:
            self.write_answer(text)
            return
        self._pieces(self.split.feed(text))

    def end(self) -> None:
        if self.split is not None:
            self._pieces(self.split.finish())
        self._close_thought()

    def _pieces(self, pieces: Sequence[tuple[str, str]]) -> None:
        for kind, text in pieces:
            if kind == "reasoning":
                if not self.hide:
                    dim = self.err.isatty()
                    self.err.write((DIM if dim else "") + self.shown(text) + (RESET if dim else ""))
                    self.err.flush()
                    self._thought_open = True
            else:
                self._close_thought()
                self.write_answer(text)

    def _close_thought(self) -> None:
        if self._thought_open:
            self.err.write("\n")
            self.err.flush()
            self._thought_open = False
