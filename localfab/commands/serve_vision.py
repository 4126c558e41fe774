"""`localfab serve`'s vision flags, as llama-server's: a projector beside the model, and the
folder that file:// image URLs may read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from localfab.errors import UsageError

if TYPE_CHECKING:
    from localfab.plan.projector import ProjectorPlan
    from localfab.runtime import ModelChoice

F = TypeVar("F", bound=Callable[..., Any])


def vision_options(f: F) -> F:
    """-mm/--mmproj, --mmproj-offload/--no-mmproj-offload and --media-path."""
    f = click.option(
        "--media-path",
        type=click.Path(path_type=Path),
        default=None,
        help="Folder that file:// image URLs in requests may read (nothing outside it).",
    )(f)
    f = click.option(
        "--no-mmproj",
        is_flag=True,
        help="Do not load the vision projector found beside the model.",
    )(f)
    f = click.option(
        "--mmproj-offload/--no-mmproj-offload",
        default=True,
        help="Run the vision projector on the GPU (where there is one).",
    )(f)
    return click.option(
        "-mm",
        "--mmproj",
        type=click.Path(path_type=Path),
        default=None,
        help="The model's vision projector (an mmproj GGUF): requests may then hold images.",
    )(f)


def media_folder(path: Path | None) -> Path | None:
    """`--media-path`, which must be an existing folder (as llama-server)."""
    if path is not None and not path.is_dir():
        raise UsageError(f"--media-path {path} is not a folder")
    return path


def finish_load(loaded: Any, options: dict[str, Any]) -> None:
    """The loaded model with --chat-template(-file) and --mmproj applied; closed when either
    fails."""
    from localfab.commands.thinking import use_template_file

    try:
        use_template_file(loaded, options["chat_template_file"], options["chat_template"])
        if (note := attach_vision(loaded, options)) is not None:
            loaded.notices.append(note)
    except BaseException:
        loaded.close()
        raise


def plan_vision(
    choice: ModelChoice, options: dict[str, Any]
) -> tuple[ModelChoice, ProjectorPlan | None]:
    """The projector (--mmproj, else the one beside the model unless --no-mmproj) planned
    with the chosen model before either loads, and the model's choice to load with it (its
    GPU room may be kept first: `place_projector`); UsageError, in one line, for a file given
    that is no projector or fits nowhere (one found that cannot be used is left out, with a
    warning)."""
    given = options["mmproj"]
    path = given or (None if options.get("no_mmproj") else choice.projector_beside())
    if path is None:
        return choice, None
    try:
        together, placed = choice.place_projector(path, offload=options["mmproj_offload"])
    except UsageError as exc:
        if given is not None:
            raise
        click.echo(f"localfab: warning: images off: {exc}", err=True)
        return choice, None
    options["mmproj"] = path
    for warning in (w for w in together.plan.warnings if w not in choice.plan.warnings):
        click.echo(f"localfab: warning: {warning}", err=True)  # of the model planned again
    return together, placed


def attach_vision(loaded: Any, options: dict[str, Any]) -> str | None:
    """Attach --mmproj's projector to the loaded model, where its plan put it; what to tell
    the user."""
    path = options.get("mmproj")
    if path is None:
        return None
    from localfab.engine.vision import attach_projector

    placed: ProjectorPlan | None = options.get("mmproj_plan")
    use_gpu = placed.use_gpu if placed is not None else options["mmproj_offload"]
    projector = attach_projector(loaded.engine, path, use_gpu=use_gpu)
    said = f"images in requests ({projector.marker} in prompts)"
    if placed is None:
        return f"vision projector {path.name}: {said}"
    return f"{placed.describe()}; {placed.image_cost()}; {said}"


NO_PROJECTOR = "--image needs the model's vision projector: add --mmproj FILE"


def plan_run_vision(choice: ModelChoice, flags: dict[str, Any]) -> ModelChoice:
    """`run`'s projector (--mmproj, or for --image the one beside the model) planned with
    the model before either loads (kept in `flags`), and the model's choice to load with it."""
    projector = flags["mmproj"]
    if projector is None and flags["images"]:
        projector = flags["mmproj"] = choice.projector_beside()
        if projector is None:  # said before the model loads
            raise UsageError(NO_PROJECTOR)
    if projector is None:
        return choice
    choice, flags["planned"] = choice.place_projector(Path(projector))
    return choice


def run_images(loaded: Any, flags: dict[str, Any], *, raw: bool) -> list[bytes]:
    """`run --image FILE ... --mmproj FILE`: the projector attached to the loaded model where
    `plan_run_vision` placed it, and the images' bytes (UsageError, in one line, for what
    cannot be used)."""
    paths, projector = flags["images"], flags["mmproj"]
    if projector is None:
        if paths:
            raise UsageError(NO_PROJECTOR)
        return []
    if raw and paths:
        raise UsageError("--raw sends text only: leave out --raw to send images")
    if not hasattr(loaded.engine, "model"):
        raise UsageError("--mmproj is for a model loaded here, not for --remote")
    from localfab.engine.vision import attach_projector

    placed: ProjectorPlan | None = flags.get("planned")
    attach_projector(loaded.engine, projector, use_gpu=placed is None or placed.use_gpu)
    images = []
    for path in paths:
        try:
            images.append(Path(path).read_bytes())
        except OSError as exc:
            raise UsageError(f"cannot read the image {path}: {exc.strerror or exc}") from exc
    return images
