"""`run` and the prompt cache: the disk tier for one run, and the prompt kept after it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from localfab.commands.thinking import use_template_file

if TYPE_CHECKING:
    from localfab.config import Config, Paths


# `run` keeps a prompt's state on disk only from this length (tokens): shorter ones take about
# as long to process as to read back.
RUN_CACHE_MIN = 512


def ready(
    loaded: Any, paths: Paths, config: Config, prompt_cache: bool, think: dict[str, Any]
) -> None:
    """After the load: --chat-template-file in place of the model's template, the load's
    notices on stderr, --reasoning on/off as the template's enable_thinking, and the prompt
    cache's disk tier for this one run (no RAM tier: one prompt) unless it is off."""
    from localfab.engine.prompt_cache import open_prompt_cache

    use_template_file(loaded, think["chat_template_file"], think["chat_template"])
    for notice in loaded.notices:
        click.echo(f"localfab: note: {notice}", err=True)
    loaded.prompts.set_thinking(think["reasoning"])
    if not prompt_cache:
        return
    engine = loaded.engine

    cache = open_prompt_cache(
        0,
        key=engine.state_key(),
        folder=paths.prompt_cache_dir,
        disk_limit=config.prompt_cache_disk << 20,
        note=lambda text: click.echo(f"localfab: note: {text}", err=True),
    )
    if cache.enabled:
        engine.use_prompt_cache(cache)


def keep_prompt(engine: Any, n_prompt: int, verbose: int) -> None:
    """Write the prompt's state (and the reply's) to the disk tier, after the answer, when
    the prompt is long enough to be worth it."""
    cache = getattr(engine, "prompt_cache", None)  # a remote's engine has none
    if cache is None or cache.disk is None or n_prompt < RUN_CACHE_MIN:
        return
    started = time.perf_counter()
    written = engine.persist_prompt()
    if verbose and written:
        click.echo(
            f"localfab: prompt cache: kept {len(engine.kv.cached):,} tokens in "
            f"{cache.disk.folder} ({written / 1e6:.1f} MB, "
            f"{(time.perf_counter() - started) * 1e3:.0f} ms)",
            err=True,
        )
