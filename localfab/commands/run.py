"""`localfab run`: one prompt, one streamed answer."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localfab.commands.run_cache import keep_prompt
from localfab.commands.run_remote import (
    REMOTE_FLAGS,
    open_for_run,
    remote_model_hint,
    remote_options,
)
from localfab.commands.run_tools import load_tools, reply_calls, tools_options, use_tools
from localfab.commands.serve_vision import run_images
from localfab.commands.spec_flags import gather, spec_options
from localfab.commands.thinking import (
    ThoughtStream,
    budget_options,
    chat_template_option,
    reasoning_option,
    template_file_option,
)
from localfab.errors import UsageError
from localfab.textsafe import json_controls, visible_controls
from localfab.units import KV_CACHE_TYPES, usage

if TYPE_CHECKING:
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.session import ChatEvent, ChatSession, Reply
    from localfab.config import Config, Paths
    from localfab.engine.types import Done, GenerationOptions, SamplingParams
    from localfab.ledger.writer import Ledger, LedgerWriter, ReplyRecorder
    from localfab.machine.energy import Energy
    from localfab.runtime import ModelChoice

KV_CHOICES = click.Choice(KV_CACHE_TYPES)

# The options `run` receives together, as one mapping each (see `gather`).
SAMPLING_FLAGS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")
LOAD_FLAGS = ("ctx_size", "n_gpu_layers", "cache_type_k", "cache_type_v", "flash_attn", "threads")
THINK_FLAGS = (
    "reasoning",
    "hide_thinking",
    "chat_template_file",
    "chat_template",
    "reasoning_budget",
    "reasoning_budget_message",
)


def setup_logging(verbose: int) -> None:
    """Warnings from localfab on stderr; llama.cpp's own log only for errors, with -v also its
    warnings a user can act on, with -vv every line it logs."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("localfab: %(levelname)s: %(message)s"))
    root = logging.getLogger("localfab")
    root.handlers[:] = [h for h in root.handlers if isinstance(h, logging.NullHandler)]
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    llama = logging.DEBUG if verbose >= 2 else logging.WARNING if verbose else logging.ERROR
    logging.getLogger("localfab.llama_cpp").setLevel(llama)
    # The hub library's retry lines ("Retrying in 8s [Retry 5/5]") only with -v: the error that
    # ends the command says what went wrong.
    logging.getLogger("huggingface_hub").setLevel(logging.WARNING if verbose else logging.ERROR)


def read_prompt(words: tuple[str, ...], *, hint: str = "") -> str:
    """The prompt from the arguments, after piped standard input (the document first, the
    question after it, so that questions about one document share its cached prefix);
    UsageError when both are empty (`hint`: what to try, added to it)."""
    prompt = " ".join(words)
    stdin = sys.stdin
    if not stdin.isatty():
        piped = stdin.read()
        if piped.strip():
            prompt = f"{piped.rstrip()}\n\n{prompt}" if prompt else piped
    if not prompt.strip():
        raise UsageError(hint or "no prompt: give it as arguments or pipe it on standard input")
    return prompt


@click.command(context_settings={"ignore_unknown_options": False})
@click.argument("model")
@click.argument("prompt", nargs=-1)
@click.option("--system", "-s", help="System prompt.")
@click.option(
    "-n",
    "--max-tokens",
    type=int,
    default=None,
    help="Longest reply in tokens, a hard cap (-1: no limit). Without -n the configured "
    "max_tokens applies, and a reply cut at it is continued (see --max-continues).",
)
@click.option(
    "--temperature", "--temp", type=float, default=None, help="Sampling temperature (0: greedy)."
)
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--min-p", type=float, default=None)
@click.option("--repeat-penalty", type=float, default=None)
@click.option("--seed", type=int, default=-1, show_default=True, help="-1: random.")
@click.option("--stop", multiple=True, help="Stop at this text (repeatable).")
@click.option("-c", "--ctx-size", type=int, default=None, help="Context window in tokens.")
@click.option("-ngl", "--n-gpu-layers", type=int, default=None, help="Layers to put on the GPU.")
@click.option("-ctk", "--cache-type-k", type=KV_CHOICES, default=None, help="KV cache type for K.")
@click.option("-ctv", "--cache-type-v", type=KV_CHOICES, default=None, help="KV cache type for V.")
@click.option("-fa", "--flash-attn", type=click.Choice(["auto", "on", "off"]), default=None)
@click.option(
    "-t", "--threads", type=int, default=None, help="CPU threads (default: physical cores)."
)
@click.option(
    "--max-continues",
    type=int,
    default=None,
    help="Times a reply cut at the token limit is continued (default: config max_continues, "
    "3; 0 disables). With an explicit -n, replies are continued only if this is given too.",
)
@click.option(
    "--raw", is_flag=True, help="Send the prompt as plain text, without the chat template."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (text, finish_reason, usage, timings) instead of streaming.",
)
@click.option(
    "--verbose",
    "-v",
    count=True,
    help="Timings (TTFT, prompt and decode tok/s) and llama.cpp's warnings on stderr; -vv: "
    "every line of llama.cpp's log.",
)
@click.option(
    "--prompt-cache/--no-prompt-cache",
    default=None,
    help="Keep the prompt's KV state in the cache folder and restore it next time, so that "
    "another question about the same piped document does not process it again (default: "
    "config prompt_cache, on; only prompts of 512 tokens or more are kept).",
)
@reasoning_option
@budget_options
@template_file_option(exists=False)  # a missing file: localfab's own clear error
@chat_template_option
@click.option(
    "--hide-thinking",
    is_flag=True,
    help="Do not print a thinking model's thought (it goes to stderr, dimmed, otherwise).",
)
@click.option(
    "--no-ledger",
    is_flag=True,
    help="Do not record this reply in the usage ledger (see localfab stats).",
)
@tools_options
@spec_options
@gather("tool_flags", ("tools_file", "tool_choice"))
@remote_options
@click.option(
    "--image",
    "images",
    multiple=True,
    type=click.Path(path_type=Path),
    help="An image for a vision model, before the prompt (repeatable; needs --mmproj).",
)
@click.option("-mm", "--mmproj", type=click.Path(path_type=Path), help="The model's projector.")
@gather("vision_flags", ("images", "mmproj"))
@gather("load_flags", LOAD_FLAGS + REMOTE_FLAGS)
@gather("sampling_flags", SAMPLING_FLAGS)
@gather("think_flags", THINK_FLAGS)
def run(
    model: str,
    prompt: tuple[str, ...],
    system: str | None,
    max_tokens: int | None,
    stop: tuple[str, ...],
    max_continues: int | None,
    raw: bool,
    as_json: bool,
    verbose: int,
    prompt_cache: bool | None,
    no_ledger: bool,
    tool_flags: dict[str, Any],
    sampling_flags: dict[str, Any],
    load_flags: dict[str, Any],
    spec_flags: dict[str, Any],
    think_flags: dict[str, Any],
    vision_flags: dict[str, Any],
) -> None:
    """Answer PROMPT with MODEL (a .gguf path or a registered name), streaming to stdout.

    Piped standard input comes first (cat notes.md | localfab run MODEL "Summarize:") and its
    state is kept on disk for the next question (--prompt-cache). A thinking model's thought
    goes to stderr (--hide-thinking: nowhere). Ctrl-C stops the answer, keeps what was
    printed and exits with 130.
    """
    from localfab.chat.session import ChatSession
    from localfab.config import Config, default_paths
    from localfab.machine.energy import Energy

    setup_logging(verbose)
    _check_limits(max_tokens, load_flags["ctx_size"], max_continues)
    tools = load_tools(**tool_flags, raw=raw)
    text = read_prompt(prompt, hint=remote_model_hint(model, prompt, load_flags["remote"]))
    config = Config.load(paths := default_paths())
    flags = (prompt_cache, think_flags, load_flags, spec_flags, vision_flags)
    loaded, choice, speculative = open_for_run(model, paths, config, verbose, *flags)
    images = run_images(loaded, vision_flags, raw=raw)
    no_ledger = no_ledger or choice is None  # the ledger records this machine's work only
    # An explicit -n is a hard cap (llama.cpp); only the configured limit goes on by itself.
    continues = _pick(max_continues, config.max_continues if max_tokens is None else 0)
    options = _options(config, max_tokens, stop, sampling_flags, think_flags)
    system, options, continues = use_tools(tools, loaded.prompts, system, options, continues)
    session = ChatSession(
        loaded.engine, loaded.prompts, system=None if raw else system, max_continues=continues
    )
    tokens, events = _start(session, loaded.prompts, text, options, raw, system, images)
    writer, ledger, recorder = _recorder(config, paths, model, choice, no_ledger)
    events = recorder.wrap(events, prompt_tokens=len(tokens))
    reply = _stream(events, as_json, verbose, hide=think_flags["hide_thinking"])
    energy = recorder.energy or Energy(None, "", "not measured")
    _report(reply, model, len(tokens), energy, as_json=as_json, calls=reply_calls(reply, tools))
    if verbose:
        past = speculative is not None and loaded.engine.speculation_batch_past > 1
        measured = energy if choice is not None else None
        _report_timings(reply, measured, drafts=speculative is not None, past=past)
    keep_prompt(loaded.engine, len(tokens), verbose)
    if writer is not None and ledger is not None:
        _close_ledger(writer, ledger, recorder, verbose)
    loaded.close()


def _options(
    config: Config,
    max_tokens: int | None,
    stop: tuple[str, ...],
    sampling_flags: dict[str, Any],
    think_flags: dict[str, Any],
) -> GenerationOptions:
    """What the reply asks for: the token limit, the sampler, stops and the reasoning budget."""
    from localfab.engine.types import GenerationOptions

    return GenerationOptions(
        _pick(max_tokens, config.max_tokens),
        _sampling(config, sampling_flags),
        stop,
        reasoning_budget=think_flags["reasoning_budget"],
        reasoning_budget_message=think_flags["reasoning_budget_message"],
    )


def _start(
    session: ChatSession,
    prompts: PromptBuilder,
    text: str,
    options: GenerationOptions,
    raw: bool,
    system: str | None,
    images: list[bytes],
) -> tuple[list[int], Iterator[ChatEvent]]:
    """The prompt's tokens and the reply's events: a chat turn (a thinking template's reply
    split into thought and answer), or with --raw the text (after the system prompt, if any)
    as it is."""
    if raw:
        tokens = prompts.raw(text if system is None else f"{system}\n\n{text}")
        return tokens, session.complete(tokens, options)
    from localfab.chat.images import image_message

    window = session.window()
    content, pinned = (text, []) if not images else image_message(text, images, *_plain(prompts))
    turn = {"role": "user", "content": content}
    tokens = prompts.tokens([*window, turn], pinned={len(window): pinned} if images else None)
    return tokens, session.send(text, options, images=images)


def _plain(prompts: PromptBuilder) -> tuple[Any, Callable[[str], list[int]]]:
    engine = prompts.engine
    return engine, lambda text: engine.tokenize(text, add_special=False, parse_special=False)


def _sampling(config: Config, flags: dict[str, Any]) -> SamplingParams:
    """The options given, else the configured defaults (the seed has its own default, -1)."""
    from localfab.engine import SamplingParams

    given = {name: _pick(flags[name], getattr(config, name)) for name in SAMPLING_FLAGS[:-1]}
    return SamplingParams(**given, seed=flags["seed"])


def _close_ledger(
    writer: LedgerWriter, ledger: Ledger, recorder: ReplyRecorder, verbose: int
) -> None:
    """Wait for the row to be written; -v says when it could not be."""
    writer.close()
    if recorder.row is not None and ledger.last_error and verbose:
        click.echo(f"localfab: note: not recorded in the ledger: {ledger.last_error}", err=True)


def _check_limits(max_tokens: int | None, ctx_size: int | None, max_continues: int | None) -> None:
    if max_tokens is not None and (max_tokens == 0 or max_tokens < -1):
        raise UsageError(
            f"--max-tokens must be a positive number or -1 (no limit), not {max_tokens}"
        )
    if ctx_size is not None and ctx_size < 16:
        raise UsageError(f"--ctx-size {ctx_size} is too small; use at least 16")
    if max_continues is not None and max_continues < 0:
        raise UsageError(f"--max-continues must be 0 or more, not {max_continues}")


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _recorder(
    config: Config, paths: Paths, model: str, choice: ModelChoice | None, no_ledger: bool
) -> tuple[LedgerWriter | None, Ledger | None, ReplyRecorder]:
    """The reply's recorder: energy always (for -v), a ledger row unless turned off; a
    remote's reply (no `choice`) is neither: its energy is not this machine's."""
    from localfab.ledger.writer import (
        Ledger,
        LedgerWriter,
        ReplyRecorder,
        ledger_enabled,
        ledger_path,
    )
    from localfab.machine.energy import EnergyMeter

    ledger = None
    if not no_ledger and ledger_enabled(config):
        ledger = Ledger(ledger_path(paths.data_dir))
    # The row is written by a background thread while the reply's end is printed.
    writer = LedgerWriter(ledger) if ledger is not None else None
    recorder = ReplyRecorder(
        writer,
        frontend="run",
        model=model,
        plan=choice.plan if choice else None,
        meter=EnergyMeter.for_this_machine() if choice else None,
        model_path=choice.path if choice else "",
    )
    return writer, ledger, recorder


def _report(
    reply: Reply,
    model: str,
    n_prompt: int,
    energy: Energy,
    *,
    as_json: bool,
    calls: list[dict[str, Any]] | None = None,
) -> None:
    """End the streamed text, or write the one JSON object `--json` asks for (a thinking
    model's thought in `reasoning_content`, its answer in `text`); with tools, the calls (a
    JSON line each, or `tool_calls`)."""
    out = sys.stdout
    last = reply.pieces[-1]
    if as_json:
        result = {
            "model": model,
            "text": reply.text,
            **({"reasoning_content": reply.reasoning} if reply.reasoning else {}),
            **({"tool_calls": calls} if calls is not None else {}),
            # As the server says it: a reply that ended in calls ends for them.
            "finish_reason": "tool_calls"
            if calls and reply.finish_reason == "stop"
            else reply.finish_reason,
            "stop_type": reply.stop_type,
            "stopping_word": last.stopping_word,
            "continues": reply.continues,
            "usage": usage(n_prompt, reply.completion_tokens),
            "timings": reply.timings.to_dict()
            | draft_counts(reply.pieces)
            | {
                "energy_j": energy.joules,
                "tokens_per_j": energy.tokens_per_joule(reply.completion_tokens),
                "energy_source": energy.source or None,
            },
        }
        line = json.dumps(result, ensure_ascii=False)
        out.write((json_controls(line) if out.isatty() else line) + "\n")
    else:
        out.write("\n" if reply.text or not calls else "")
        for call in calls or ():
            line = json.dumps(call, ensure_ascii=False)
            out.write((json_controls(line) if out.isatty() else line) + "\n")
    out.flush()


def _report_timings(reply: Reply, energy: Energy | None, *, drafts: bool, past: bool) -> None:
    """-v: the reply's figures on stderr (`energy` None: a remote's reply, not measured here)."""
    t = reply.timings
    steps = sum(max(0, p.timings.predicted_n - 1) for p in reply.pieces)
    decode_ms = sum(p.timings.predicted_ms for p in reply.pieces)
    decode = steps / decode_ms * 1e3 if decode_ms > 0 else 0.0
    click.echo(
        f"localfab: {t.prompt_n} prompt tokens ({t.cache_n} cached), TTFT {t.ttft_ms:.0f} ms, "
        f"prompt {t.prompt_per_second:.1f} tok/s, decode {decode:.1f} tok/s; "
        f"{reply.completion_tokens} tokens, {reply.continues} continuation(s), "
        f"stop: {reply.stop_type}",
        err=True,
    )
    if t.restored_n:
        click.echo(
            f"localfab: prompt cache: {t.restored_n:,} prompt tokens restored from "
            f"{t.restored_from} in {t.restore_ms:.0f} ms",
            err=True,
        )
    if energy is not None:
        click.echo(f"localfab: {describe_energy(energy, reply.completion_tokens)}", err=True)
    if drafts:
        click.echo(f"localfab: {describe_drafts(reply.pieces, past=past)}", err=True)


def _stream(
    events: Iterator[ChatEvent],
    as_json: bool,
    verbose: int,
    *,
    hide: bool = False,
) -> Reply:
    """Print the reply as it streams (unless JSON is asked for): a thinking model's thought on
    stderr (unless `hide`), the answer on stdout; return the finished reply."""
    from localfab.chat.session import Continued, Reply, Shifted

    out = sys.stdout
    # On a terminal, model text never carries a control sequence to it (a pipe gets the bytes).
    shown = visible_controls if out.isatty() else str

    def answer(text: str) -> None:
        out.write(shown(text))
        out.flush()

    stream = ThoughtStream(answer, hide=hide or as_json, shown=visible_controls)
    reply: Reply | None = None
    for event in events:
        if isinstance(event, Reply):
            reply = event
        elif isinstance(event, Continued):
            if verbose:
                click.echo(
                    f"\nlocalfab: the reply hit the token limit; continuing "
                    f"({event.count}/{event.limit})",
                    err=True,
                )
        elif isinstance(event, Shifted):
            click.echo(f"\nlocalfab: {event.describe()}", err=True)
        elif not as_json:
            stream.write(event)
    stream.end()
    assert reply is not None
    return reply


def draft_counts(pieces: Sequence[Done]) -> dict[str, int]:
    """llama-server's draft_n / draft_n_accepted over every piece; empty when nothing drafted."""
    drafted = sum(p.timings.draft_n for p in pieces)
    if not drafted:
        return {}
    return {
        "draft_n": drafted,
        "draft_n_accepted": sum(p.timings.draft_n_accepted for p in pieces),
    }


def describe_drafts(pieces: Sequence[Done], *, past: bool = True) -> str:
    """The speculative decoding line of -v: tokens drafted, kept, and the acceptance rate.
    `past`: whether drafts can be verified past `ONE_THREAD_CELLS` of context."""
    drafted = sum(p.timings.draft_n for p in pieces)
    kept = sum(p.timings.draft_n_accepted for p in pieces)
    if not drafted:
        why = "the reply did not repeat its input"
        if not past:
            from localfab.engine.types import ONE_THREAD_CELLS

            why += f", or its context was past the {ONE_THREAD_CELLS} tokens where none is checked"
        return f"speculative decoding: nothing drafted ({why})"
    return (
        f"speculative decoding: {drafted} tokens drafted, {kept} accepted "
        f"(acceptance {kept / drafted:.0%})"
    )


def describe_energy(energy: Energy, tokens: int) -> str:
    """The energy line of -v: joules and tokens per joule, or why they are missing."""
    if energy.joules is None:
        return f"energy not measured: {energy.note}"
    per_j = energy.tokens_per_joule(tokens)
    rate = f", {per_j:.2f} tok/J" if per_j is not None else ""
    return f"energy {energy.joules:.2f} J ({energy.source}){rate}"
