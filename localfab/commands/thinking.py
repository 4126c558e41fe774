"""`run` and a thinking model: the thought on stderr (dimmed on a terminal, or hidden), the
answer on stdout, and what a reply's template thinks in."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from localfab.engine.types import TokenEvent

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


def budget_options(f: Any) -> Any:
    """--reasoning-budget and --reasoning-budget-message, as llama-server's."""
    f = click.option(
        "--reasoning-budget-message",
        default="",
        help="Written before the closing tag when the reasoning budget closes the block "
        "(e.g. ' Time to answer.').",
    )(f)
    return click.option(
        "--reasoning-budget",
        type=click.IntRange(min=-1),
        default=-1,
        show_default=True,
        help="Tokens a thinking model may think before its block is closed and the answer "
        "begins (0: answer at once, -1: no limit).",
    )(f)


def template_file_option(*, exists: bool) -> Callable[[Any], Any]:
    return click.option(
        "--chat-template-file",
        type=click.Path(exists=exists, dir_okay=False, path_type=Path),
        default=None,
        help="Use this Jinja chat template instead of the model's (as llama-server).",
    )


chat_template_option = click.option(
    "--chat-template",
    default=None,
    help="A built-in chat template by name (chatml, llama3, gemma, phi3, or any of llama.cpp's: "
    "command-r, mistral-v7, zephyr, ...) or a Jinja template's text, instead of the model's "
    "(as llama-server).",
)


def use_template_file(loaded: Any, path: Path | None, text: str | None = None) -> None:
    """--chat-template-file (the template in `path`) or --chat-template (a built-in's name or
    a template's text) instead of the model's, as llama-server; a note about the model's own
    template no longer applies."""
    if path is None and not text:
        return
    from localfab.chat.legacy_templates import legacy_template
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.templates import BUILTIN_TEMPLATES
    from localfab.errors import UsageError

    if path is not None and text:
        raise UsageError("give --chat-template or --chat-template-file, not both")
    old = loaded.prompts.notice
    if path is not None:
        loaded.prompts = PromptBuilder.from_file(loaded.engine, path)
    elif text in BUILTIN_TEMPLATES:
        loaded.prompts = PromptBuilder(loaded.engine, source=BUILTIN_TEMPLATES[text], name=text)
    elif text and (legacy := legacy_template(text)) is not None:
        loaded.prompts = PromptBuilder(loaded.engine, legacy)
    else:
        loaded.prompts = PromptBuilder(loaded.engine, source=text)
    loaded.notices = [n for n in loaded.notices if n != old]


class ThoughtStream:
    """Writes a reply's text as it streams: the answer through `write_answer` (stdout), the
    thought to stderr, dimmed on a terminal, unless `hide`. The reply's events say which is
    which (`TokenEvent.parts`; without them all of the text is the answer)."""

    def __init__(
        self,
        write_answer: Callable[[str], None],
        *,
        hide: bool = False,
        shown: Callable[[str], str] = str,
    ) -> None:
        self.write_answer = write_answer
        self.hide = hide
        self.shown = shown
        self.err = sys.stderr
        self._thought_open = False

    def write(self, event: TokenEvent) -> None:
        if event.parts is None:
            if event.text:
                self._close_thought()
                self.write_answer(event.text)
            return
        for kind, text in event.parts:
            if kind == "reasoning":
                if not self.hide:
                    dim = self.err.isatty()
                    self.err.write((DIM if dim else "") + self.shown(text) + (RESET if dim else ""))
                    self.err.flush()
                    self._thought_open = True
            else:
                self._close_thought()
                self.write_answer(text)

    def end(self) -> None:
        self._close_thought()

    def _close_thought(self) -> None:
        if self._thought_open:
            self.err.write("\n")
            self.err.flush()
            self._thought_open = False
