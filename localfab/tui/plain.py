"""Text from outside the app as widgets show it: literally, never as markup.

Model names, file names, servers' error messages, tool names and config values reach labels,
tables and toasts. Textual reads a `str` given to most widgets as content markup, so `[/x]` in a
remote server's error ends the app (MarkupError) and `[@click=app.quit]quit[/]` becomes a
clickable action. The app uses no markup anywhere: a `Label` or `Static` is made with
`markup=False`, and where a widget has no such switch (a button's or a collapsible's title, a
select option, a data table cell, a command palette entry) the text goes in through `plain`,
`plain_cell`, `palette_name` or `escaped`. Control characters are made visible on the way
(`localfab.textsafe`).
"""

from __future__ import annotations

from rich.text import Text
from textual.content import Content
from textual.fuzzy import Matcher
from textual.markup import escape

from localfab.textsafe import visible_controls


def plain(text: str) -> Content:
    """`text` as Textual content that no widget reads as markup."""
    return Content(visible_controls(text))


def plain_cell(text: str) -> Text:
    """`text` for a DataTable cell or column label (which read a `str` as Rich markup), cut at
    the cell's edge as a one-line `str` cell is."""
    return Text(visible_controls(text), no_wrap=True, end="")


def palette_name(matcher: Matcher, name: str) -> Content:
    """A command palette entry's name with the letters the query matched picked out (Textual's
    `Matcher.highlight` reads the name as markup: one that would read as markup is shown as it
    is, without the picked-out letters)."""
    shown = visible_controls(name)
    if escape(shown) != shown:
        return Content(shown)
    return matcher.highlight(shown)


def escaped(text: str) -> str:
    """`text` escaped, for where Textual takes only a `str` and reads it as markup (a command
    palette entry's help line, a collapsible's title)."""
    return escape(visible_controls(text))
