"""Keys remapped by action id from the [keys] table of config.toml.

Every binding in the app has an id ("chat.stop"); the table maps ids, or their short form when
only one action has it ("stop"), to key names. Unknown ids and key names that no terminal sends
are reported (the app shows them as warnings) and leave that action on its default keys.
"""

from __future__ import annotations

import importlib
import pkgutil
import string
from collections.abc import Iterable
from dataclasses import dataclass

from textual.binding import Binding
from textual.dom import DOMNode
from textual.keys import KEY_NAME_REPLACEMENTS, KEY_TO_UNICODE_NAME, Keys, _character_to_key

MODIFIERS = frozenset({"ctrl", "shift", "alt", "meta", "super", "hyper"})


def _key_names() -> frozenset[str]:
    """Names of the keys a binding can use, without modifiers."""
    names = {k.value.rsplit("+", 1)[-1] for k in Keys}
    names |= set(KEY_NAME_REPLACEMENTS.values()) | set(KEY_TO_UNICODE_NAME)
    names |= {_character_to_key(c) for c in string.printable if not c.isspace()}
    names |= {"space", "tab", "enter", "backspace", "newline"}
    names |= {f"f{n}" for n in range(1, 25)}
    return frozenset(names)


KEY_NAMES = _key_names()


def bad_key(keys: str) -> str | None:
    """The first key in a comma-separated list that is not a key name, or None if all are."""
    for key in (k.strip() for k in keys.split(",")):
        *mods, base = key.lower().split("+")
        if not key or not base or any(m not in MODIFIERS for m in mods):
            return key
        if len(base) != 1 and base not in KEY_NAMES:
            return key
    return None


def binding_ids(root: type[DOMNode] = DOMNode, *, package: str = "localfab.tui") -> set[str]:
    """The ids of every binding declared by the app's classes (those in `package`).

    Every module of `package` is imported first: screens are imported when first opened, and a
    keymap checked before that would call their actions unknown ("models.back").
    """
    top = importlib.import_module(package)
    for info in pkgutil.walk_packages(top.__path__, package + "."):
        importlib.import_module(info.name)
    ids: set[str] = set()
    todo = [root]
    seen: set[type] = set()
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            todo.append(sub)
            if sub.__module__.startswith(package):
                for binding in sub.__dict__.get("BINDINGS", ()):
                    if isinstance(binding, Binding) and binding.id:
                        ids.add(binding.id)
    return ids


@dataclass(frozen=True)
class Keymap:
    """A checked keymap: what Textual's `set_keymap` takes, and what was refused and why."""

    keys: dict[str, str]
    problems: tuple[str, ...]


def check_keymap(pairs: Iterable[tuple[str, str]], known: set[str]) -> Keymap:
    """Map each (action id, keys) pair to a binding id, refusing unknown ids and key names."""
    short: dict[str, list[str]] = {}
    for full in sorted(known):
        short.setdefault(full.split(".", 1)[-1], []).append(full)
    keys: dict[str, str] = {}
    problems: list[str] = []
    for name, value in pairs:
        if name in known:
            target = name
        elif len(short.get(name, [])) == 1:
            target = short[name][0]
        elif name in short:
            choices = ", ".join(short[name])
            problems.append(f"keys.{name}: several actions are called {name} ({choices}); use one")
            continue
        else:
            problems.append(
                f"keys.{name}: there is no such action; the ids are {', '.join(sorted(known))}"
            )
            continue
        wrong = bad_key(value)
        if wrong is not None:
            problems.append(
                f"keys.{name}: {wrong!r} is not a key name (try ctrl+x, f2, escape or "
                "shift+up); the default keys stay"
            )
            continue
        keys[target] = value
    return Keymap(keys, tuple(problems))
