"""`localfab pull | list | show | rm | add`: get models and manage what is on disk.

Only click and the light store module are imported here; `huggingface_hub` is imported inside
`pull`, and the GGUF reader and planner only where a command shows facts or fit verdicts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localfab.config import default_paths
from localfab.units import format_context, human_age, human_size

if TYPE_CHECKING:
    from localfab.store import ModelEntry, Store


def _store() -> Store:
    """The store, with its warnings (damaged registry entries) shown on stderr."""
    from localfab.commands.run import setup_logging
    from localfab.store import Store

    setup_logging(False)
    return Store(default_paths())


# commands ---------------------------------------------------------------------------------------
@click.command()
@click.argument("model")
@click.option("--name", help="Register under this name (default: catalog or file name).")
@click.option(
    "--token",
    help="Hugging Face token for gated or private repos (default: HF_TOKEN, or `hf auth login`).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option(
    "--mmproj/--no-mmproj",
    default=True,
    help="Also fetch a vision model's projector (mmproj), as llama-server -hf does.",
)
def pull(model: str, name: str | None, token: str | None, quiet: bool, mmproj: bool) -> None:
    """Download MODEL: a catalog name, OWNER/REPO[:QUANT] or a Hugging Face URL.

    \b
    The default quant is Q4_K_M; split GGUFs are fetched whole. Free disk
    space is checked first, an interrupted download resumes where it
    stopped, and the model is registered only after its sha256 matches the
    hub's. HF_ENDPOINT selects a mirror; HF_HUB_OFFLINE=1 forbids the network.

    \b
    Examples:
      localfab pull qwen2.5:7b
      localfab pull bartowski/Llama-3.2-3B-Instruct-GGUF:Q5_K_M
      localfab pull https://huggingface.co/bartowski/phi-4-GGUF
    """
    from localfab.commands.progress import ProgressLine
    from localfab.hub import Hub, HubConfig

    store = _store()
    bar = ProgressLine(enabled=not quiet)
    try:
        result = Hub(HubConfig.from_env(token=token)).pull(
            model, store=store, name=name, progress=bar, projector=mmproj
        )
    finally:
        bar.close()
    entry = result.entry
    if result.already_present:
        click.echo(f"{entry.name} is already here ({human_size(entry.size)}): {entry.path}")
        return
    resumed = f", resumed from {human_size(result.resumed)}" if result.resumed else ""
    check = "sha256 verified" if result.verified else "no sha256 published: size checked only"
    click.echo(
        f"pulled {entry.name}: {human_size(entry.size)} {entry.quant or ''} "
        f"{entry.arch or ''}".rstrip()
        + f" ({check}{resumed})"
    )
    click.echo(f"  {entry.path}")
    if entry.projector is not None:
        click.echo(f"  reads images: its vision projector {entry.projector.name} came with it")
    click.echo(f'  run it: localfab run {entry.name} "Hello"')


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@click.option("--catalog", "show_catalog", is_flag=True, help="The curated models to pull.")
@click.option("--no-fit", is_flag=True, help="Skip the fit verdict (reads every GGUF header).")
def list_models(as_json: bool, show_catalog: bool, no_fit: bool) -> None:
    """The models on this machine (or, with --catalog, the curated ones to pull)."""
    store = _store()
    if show_catalog:
        _list_catalog(store, as_json=as_json)
        return
    entries = store.list()
    from localfab.runtime import FitJudge

    judge = FitJudge()
    fits = {e.name: (None if no_fit or not e.present else judge(e.path)) for e in entries}
    if as_json:
        click.echo(json.dumps([_entry_json(e, fits.get(e.name)) for e in entries], indent=2))
        return
    if not entries:
        click.echo("no models yet: `localfab pull qwen2.5:1.5b`, or `localfab list --catalog`")
    else:
        rows = [("NAME", "SIZE", "QUANT", "ARCH", "FIT", "LAST USED")]
        for e in entries:
            size = human_size(e.size) if e.present else "missing"
            if e.source == "embedded" and not e.present:
                size = "built in"
            rows.append(
                (
                    e.name,
                    size,
                    e.quant or "-",
                    (e.arch or "-") + (" vision" if e.vision else ""),
                    fits.get(e.name) or "-",
                    human_age(e.last_used),
                )
            )
        _table(rows)
    partials = store.partial_files()
    if partials:
        total = sum(p.stat().st_size for p in partials)
        click.echo(
            f"{len(partials)} unfinished download(s), {human_size(total)} kept: pulling the "
            f"same model again resumes it",
            err=True,
        )


def _list_catalog(store: Store, *, as_json: bool) -> None:
    from localfab.store.catalog import load_catalog

    catalog = load_catalog()
    have = {(e.repo, e.files[0].name) for e in store.list() if e.repo and e.files}
    if as_json:
        items = [
            {
                "name": c.name,
                "aliases": list(c.aliases),
                "title": c.title,
                "repo": c.repo,
                "files": list(c.files),
                "quant": c.quant,
                "size_bytes": c.size_bytes,
                "params": c.params,
                "license": c.license,
                "context_length": c.context_length,
                "note": c.note,
                "vision": c.vision,
                "downloaded": (c.repo, c.files[0]) in have,
            }
            for c in catalog
        ]
        click.echo(json.dumps(items, indent=2))
        return
    rows = [("NAME", "SIZE", "PARAMS", "CONTEXT", "LICENCE", "", "NOTE")]
    for c in catalog:
        here = "here" if (c.repo, c.files[0]) in have else ""
        rows.append(
            (
                c.name,
                f"~{human_size(c.size_bytes)}",
                c.params,
                format_context(c.context_length),
                c.license,
                here,
                ("[vision] " if c.vision else "") + c.note,
            )
        )
    _table(rows)


def _table(rows: Sequence[tuple[str, ...]], *, header: bool = True) -> None:
    """Aligned columns on stdout, two spaces apart; the first row is the header when `header`.

    On a terminal, long cells wrap to its width; in a pipe no line is ever wrapped, so each row
    stays one line that scripts can split.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    out = sys.stdout
    tty = out.isatty()
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_header=header, header_style="bold")
    first, *body = rows if header else [tuple("" for _ in rows[0]), *rows]
    for title in first:
        table.add_column(Text(title), no_wrap=not tty)
    for row in body:
        table.add_row(*(Text(cell) for cell in row))
    console = Console(file=out, width=None if tty else 1 << 16, highlight=False, soft_wrap=False)
    with console.capture() as capture:
        console.print(table)
    for line in capture.get().splitlines():
        click.echo(line.rstrip())


def _entry_json(e: ModelEntry, fit: str | None) -> dict[str, Any]:
    return {
        "name": e.name,
        "path": str(e.path),
        "files": [str(p) for p in e.files],
        "size": e.size,
        "quant": e.quant,
        "arch": e.arch,
        "source": e.source,
        "repo": e.repo,
        "revision": e.revision,
        "sha256": list(e.sha256),
        "present": e.present,
        "fit": fit,
        "added": e.added,
        "last_used": e.last_used,
        "projector": str(e.projector) if e.projector else None,
        "vision": e.vision,
    }


@click.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def show(name: str, as_json: bool) -> None:
    """What NAME is: file, size, quant, origin, and the facts in its GGUF header."""
    from localfab.errors import ModelNotFound

    store = _store()
    path = store.resolve(name)
    entry = store.get(name) or next((e for e in store.list() if e.path == path), None)
    facts: Any = None
    try:
        from localfab.gguf.facts import read_facts
    except ImportError:
        read_facts = None  # type: ignore[assignment]
    if read_facts is not None:
        facts = read_facts(path)
    from localfab.plan.summary import summarise_plan
    from localfab.runtime import FitJudge

    model_plan = FitJudge().plan(path)
    fit = None if model_plan is None else summarise_plan(model_plan)
    if as_json:
        data = _entry_json(entry, fit) if entry else {"name": name, "path": str(path)}
        if facts is not None and hasattr(facts, "to_dict"):
            data["facts"] = facts.to_dict()
        if model_plan is not None and hasattr(model_plan, "to_dict"):
            data["plan"] = model_plan.to_dict()
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if entry is None and not path.is_file():
        raise ModelNotFound(f"{name}: {path} does not exist")
    lines = _entry_lines(entry, name, path) + _facts_lines(facts)
    lines.append(("fit", fit or "unknown (no planner available)"))
    if model_plan is not None:
        lines.append(
            (
                "plan",
                f"-ngl {model_plan.n_gpu_layers} -c {model_plan.n_ctx} "
                f"-ctk {model_plan.type_k} -ctv {model_plan.type_v}, "
                f"about {model_plan.predicted_tok_s:.1f} tok/s (`localfab plan {name}` explains)",
            )
        )
        lines += [("warning", w) for w in getattr(model_plan, "warnings", ())]
    _table(lines, header=False)


def _entry_lines(entry: ModelEntry | None, name: str, path: Path) -> list[tuple[str, str]]:
    """`show`'s lines about the stored model: name, path, size, origin."""
    lines: list[tuple[str, str]] = [("name", entry.name if entry else name), ("path", str(path))]
    if entry is None:
        return [*lines, ("size", human_size(path.stat().st_size))]
    if len(entry.files) > 1:
        lines.append(("parts", str(len(entry.files))))
    lines += [
        ("size", human_size(entry.size)),
        ("quant", entry.quant or "-"),
        ("source", entry.source + (f" ({entry.repo})" if entry.repo else "")),
    ]
    if entry.projector is not None:
        state = "reads images" if entry.vision else "missing"
        lines.append(("vision", f"{state}: projector {entry.projector}"))
    if entry.revision:
        lines.append(("revision", entry.revision))
    if entry.sha256 and any(entry.sha256):
        lines.append(("sha256", ", ".join(s for s in entry.sha256 if s)))
    lines.append(("last used", human_age(entry.last_used)))
    return lines


def _facts_lines(facts: Any) -> list[tuple[str, str]]:
    """`show`'s lines about the GGUF header (none when it could not be read)."""
    if facts is None:
        return []
    return [
        ("architecture", str(getattr(facts, "arch", "-"))),
        ("layers", str(getattr(facts, "n_layer", "-"))),
        ("embedding", str(getattr(facts, "n_embd", "-"))),
        (
            "heads / KV heads",
            f"{getattr(facts, 'n_head', '-')} / {getattr(facts, 'n_head_kv', '-')}",
        ),
        ("trained context", str(getattr(facts, "n_ctx_train", "-"))),
        ("vocabulary", str(getattr(facts, "n_vocab", "-"))),
        ("sliding window", str(getattr(facts, "sliding_window", None) or "none")),
        ("chat template", "yes" if getattr(facts, "chat_template", None) else "no"),
    ]


@click.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def rm(name: str, yes: bool) -> None:
    """Remove NAME: delete a downloaded model's files, or forget a model added by path."""
    from localfab.errors import ModelNotFound

    store = _store()
    entry = store.get(name)
    damaged = store.damaged(name) if entry is None else None
    if entry is None and damaged is None:
        raise ModelNotFound(f"no model called {name!r} is registered: `localfab list` shows them")
    if not yes:
        if damaged is not None:
            question = f"forget the damaged registry entry {ascii(damaged)}? (no file is deleted)"
        elif entry is not None and not entry.owned:
            question = f"forget {entry.name}? (the file stays at {entry.path})"
        elif entry is not None:
            size = f"{human_size(entry.size)} of files" if entry.size else "its files"
            question = f"remove {entry.name} and delete {size}?"
        if not click.confirm(question, default=False, err=True):
            click.echo("nothing removed", err=True)
            sys.exit(1)
    removed = store.remove(name)
    if damaged is not None:
        click.echo(f"forgot the damaged entry {ascii(removed.name)}; no file was deleted")
    elif removed.kept:
        click.echo(f"forgot {removed.name}; the file stays at {removed.kept[0]}")
    else:
        click.echo(f"removed {removed.name}, freed {human_size(removed.bytes_freed)}")


@click.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--name", help="Register under this name (default: from the file name).")
def add(path: Path, name: str | None) -> None:
    """Register the GGUF file PATH where it is, without copying it."""
    entry = _store().add(path, name=name)
    what = f"{human_size(entry.size)} {entry.quant or ''} {entry.arch or ''}".rstrip()
    click.echo(f"added {entry.name}: {what}")
    click.echo(f"  {entry.path}")
