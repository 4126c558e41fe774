"""The speculative decoding flags, shared by `run` and `serve` (llama-server's names)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

if TYPE_CHECKING:
    from localfab.config import Config, Paths
    from localfab.engine.types import SpecSettings

F = TypeVar("F", bound=Callable[..., Any])

SPEC_FLAGS = (
    "spec_type",
    "model_draft",
    "draft_max",
    "draft_min",
    "draft_p_min",
    "gpu_layers_draft",
    "spec_exact",
)


def gather(key: str, names: Sequence[str]) -> Callable[[F], F]:
    """Hand a command the options `names` together, as one mapping, its argument `key`."""

    def apply(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[key] = {name: kwargs.pop(name) for name in names}
            return f(*args, **kwargs)

        return cast(F, command)

    return apply


def spec_options(f: F) -> F:
    """Add --spec-type, -md, --draft-max, --draft-min, --draft-p-min, -ngld, --spec-exact.

    The command receives them together, as one `spec_flags` mapping (for `speculation`).
    """
    command = gather("spec_flags", SPEC_FLAGS)(f)
    decorators = [
        click.option(
            "--spec-type",
            type=click.Choice(["none", "ngram-simple", "draft-simple"]),
            default=None,
            help="Speculative decoding: ngram-simple drafts from the prompt and the reply so "
            "far, draft-simple from the draft model -md (default: config [speculative], else "
            "none).",
        ),
        click.option(
            "-md", "--model-draft", default=None, help="Draft model (same vocabulary, smaller)."
        ),
        click.option(
            "--draft-max",
            "--spec-draft-n-max",
            "draft_max",
            type=int,
            default=None,
            help="Most tokens to draft at once (1-64; default 48 with ngram-simple, 16 with a "
            "draft model).",
        ),
        click.option(
            "--draft-min",
            "--spec-draft-n-min",
            "draft_min",
            type=int,
            default=None,
            help="Fewest drafted tokens worth verifying (0).",
        ),
        click.option(
            "--draft-p-min",
            type=float,
            default=None,
            help="The draft model stops drafting below this probability (0.75).",
        ),
        click.option(
            "-ngld",
            "--gpu-layers-draft",
            type=int,
            default=None,
            help="Draft model layers on the GPU (default: as -ngl).",
        ),
        click.option(
            "--spec-exact/--no-spec-exact",
            default=None,
            help="Keep the text exactly that of plain decoding by verifying only as many tokens "
            "at once as llama.cpp computes like one (default); --no-spec-exact drafts up to "
            "--draft-max, as llama-server does, faster, but a near tie may then go the other way.",
        ),
    ]
    wrapped: Any = command
    for decorator in reversed(decorators):
        wrapped = decorator(wrapped)
    return cast(F, wrapped)


def speculation(config: Config, paths: Paths, spec_flags: Mapping[str, Any]) -> SpecSettings | None:
    """The speculative decoding the flags and config.toml's [speculative] table ask for."""
    from localfab.runtime import speculation_from

    return speculation_from(config, paths, **spec_flags)
