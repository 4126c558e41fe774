"""The shared vocabulary in `localfab.units`, and that every layer reads it instead of a copy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from localfab import units
from localfab.chat.session import Reply
from localfab.config import Config
from localfab.engine.types import KV_TYPES, Done, SamplingParams, Timings
from localfab.server import shapes
from localfab.server.params import parse_generation
from localfab.server.settings import ServerSettings


def done(tokens: tuple[int, ...], stop_type: str, *, prompt: int = 5) -> Done:
    """A Done as the engine builds it: predicted_n counts an end-of-generation token."""
    n_pred = len(tokens) + (1 if stop_type == "eos" else 0)
    finish = "stop" if stop_type in ("eos", "word") else "length"
    return Done("x", finish, stop_type, tokens, Timings(predicted_n=n_pred), prompt)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "precise", "text"),
    [
        (int(1.5 * units.GiB), False, "1.5 GiB"),
        (340 * units.MiB, False, "340 MiB"),
        (int(4.36 * units.GiB), True, "4.36 GiB"),
        (812 * units.MiB, True, "812.0 MiB"),
        (4096, True, "4.0 KiB"),
        (512, True, "512 B"),
        (-2 * units.GiB, False, "-2.0 GiB"),
    ],
)
def test_format_bytes(n: int, precise: bool, text: str) -> None:
    assert units.format_bytes(n, precise=precise) == text


def test_a_context_size_reads_the_same_in_the_cli_and_the_tui() -> None:
    from localfab.store.catalog import load_catalog
    from localfab.tui.models import catalog_row

    assert [units.format_context(n) for n in (512, 1024, 40960, 131072)] == [
        "512",
        "1k",
        "40k",
        "128k",
    ]
    for entry in load_catalog():
        assert catalog_row(entry).context == units.format_context(entry.context_length)


def test_every_layer_offers_the_same_kv_cache_types() -> None:
    import click

    from localfab.commands.planning import KV_CHOICES as plan_choices
    from localfab.commands.run import KV_CHOICES as run_choices
    from localfab.commands.serve import KV_CHOICES as serve_choices
    from localfab.plan import KV_CACHE_TYPES

    assert KV_TYPES is units.KV_CACHE_TYPES and KV_CACHE_TYPES is units.KV_CACHE_TYPES
    for choice in (run_choices, plan_choices, serve_choices):
        assert isinstance(choice, click.Choice)
        assert tuple(choice.choices) == units.KV_CACHE_TYPES


def test_sampling_defaults_are_one_table() -> None:
    table = units.SAMPLING
    engine, config = SamplingParams(), Config()
    server = parse_generation({}, ServerSettings()).sampling
    for params in (engine, server):
        assert (params.temperature, params.top_k, params.top_p, params.min_p) == (
            table.temperature,
            table.top_k,
            table.top_p,
            table.min_p,
        )
        assert (params.repeat_penalty, params.repeat_last_n) == (
            table.repeat_penalty,
            table.repeat_last_n,
        )
    assert (config.temperature, config.top_k, config.top_p, config.min_p) == (
        table.temperature,
        table.top_k,
        table.top_p,
        table.min_p,
    )
    assert config.repeat_penalty == table.repeat_penalty


def test_the_end_of_generation_token_counts_as_llama_server_counts_it() -> None:
    # llama-server's usage.completion_tokens is n_decoded, which the sampled EOG token raises.
    assert units.completion_tokens(3, "eos") == 4
    for stop_type in ("limit", "word", "context", "cancel"):
        assert units.completion_tokens(3, stop_type) == 3


@pytest.mark.parametrize("stop_type", ["eos", "limit", "word"])
def test_server_run_and_chat_count_usage_alike(stop_type: str) -> None:
    last = done((7, 8, 9), stop_type)
    first = done((1, 2), "limit")  # a piece cut at the limit, then continued
    reply = Reply("x", last.finish_reason, stop_type, 1, (), first.timings, (first, last))
    expected = 2 + last.timings.predicted_n
    assert reply.completion_tokens == expected
    assert last.usage["completion_tokens"] == last.timings.predicted_n
    server = shapes.usage(last)
    assert server["completion_tokens"] == last.timings.predicted_n
    assert server["total_tokens"] == server["prompt_tokens"] + server["completion_tokens"]
    assert last.usage == {k: v for k, v in server.items() if k != "prompt_tokens_details"}


def test_units_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "import localfab.units\n"
        "heavy = [m for m in ('llama_cpp', 'textual', 'huggingface_hub', 'click', 'numpy')"
        " if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout
