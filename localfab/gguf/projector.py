"""A vision projector's facts (an `mmproj` GGUF, architecture `clip`), read from its header.

What the planner needs: the weights' bytes, the vision transformer's shape (image size, patch
size, width, feed-forward width, heads, layers), the projector type and its merge factor, and
so how many tokens an image takes in a prompt (llama.cpp's `clip_n_output_tokens`). Read with
the same bounded header parser as a model's facts (`header`), so a remote file costs a few
ranged requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localfab.errors import ModelCorrupt, ModelError
from localfab.gguf.header import (
    Cursor,
    FileSource,
    RangeSource,
    read_header,
)
from localfab.gguf.modelfile import check_model_file

# Projector types whose image is one square of `image_size` pixels, pooled or merged by the
# merge factor in both directions (clip_n_output_tokens).
MERGED = frozenset({"gemma3", "gemma4v", "idefics3", "internvl", "llama4", "nemotron_v2_vl"})
# Types that take every patch as a token.
PER_PATCH = frozenset({"mlp", "mlp_norm", "janus_pro", "phi4"})
# Types that place an image on a grid of positions (M-RoPE): not supported by the engine yet.
GRID = frozenset({"qwen2vl", "qwen2.5vl", "qwen25vl", "qwen3vl", "glm4v", "mimovl", "youtuvl"})


@dataclass(frozen=True)
class ProjectorFacts:
    """What an mmproj file says of itself."""

    label: str
    projector_type: str
    vision: bool
    image_size: int  # the side of the square image the projector reads (warmup size)
    patch_size: int
    n_embd: int  # the vision transformer's width
    n_ff: int
    n_head: int
    n_layer: int
    merge: int  # clip.vision.projector.scale_factor (1 when absent)
    projection_dim: int  # the text model's embedding size it projects into (0: not said)
    weights: int  # bytes of all tensors (llama.cpp's "model size")
    weights_type_size: int = 2  # bytes per element of its projection matrix (f16: 2, f32: 4)

    @property
    def n_patches(self) -> int:
        side = self.image_size // self.patch_size if self.patch_size else 0
        return side * side

    @property
    def image_tokens(self) -> int | None:
        """The tokens one image takes in a prompt; None where it depends on the image."""
        if self.projector_type in MERGED:
            return self.n_patches // (self.merge * self.merge)
        if self.projector_type in PER_PATCH:
            return self.n_patches
        if self.projector_type in ("ldp", "ldpv2", "glm_edge"):
            return self.n_patches // 4
        return None

    @property
    def grid_positions(self) -> bool:
        return self.projector_type in GRID


def read_projector(path_or_source: str | os.PathLike[str] | RangeSource) -> ProjectorFacts:
    """The facts of a projector file; `ModelError` for a file that is not one."""
    if isinstance(path_or_source, str | os.PathLike):
        path = Path(path_or_source)
        check_model_file(path)
        source: RangeSource = FileSource(path)
        label = path.name
    else:
        source, label = path_or_source, getattr(path_or_source, "label", "projector")
    header = read_header(Cursor(source, label), label)
    meta, infos = header.meta, header.infos
    if meta.get("general.architecture") != "clip":
        raise ModelError(
            f"{label} is not a vision projector (its architecture is "
            f"{meta.get('general.architecture')!r}, a projector's is 'clip'): give the "
            "model's mmproj-*.gguf file"
        )
    try:
        facts = _facts(meta, label, sum(t.nbytes for t in infos))
    except (TypeError, ValueError) as exc:
        raise ModelCorrupt(f"projector {label} is corrupt: {exc}") from exc
    # The projection's weight is copied, transposed, into the compute buffer: its type counts.
    projection = next((t for t in infos if t.name == "mm.input_projection.weight"), None)
    elements = _elements(projection.shape) if projection is not None else 0
    if projection is not None and elements:
        facts = replace(facts, weights_type_size=max(1, round(projection.nbytes / elements)))
    return facts


def _elements(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _facts(meta: dict[str, Any], label: str, weights: int) -> ProjectorFacts:
    def number(key: str, default: int | None = None) -> int:
        value = meta.get(f"clip.vision.{key}", default)
        if value is None:
            raise ModelError(f"projector {label} does not say clip.vision.{key}")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
            raise ValueError(f"clip.vision.{key} is {value!r}")
        return value

    kind = meta.get("clip.projector_type") or meta.get("clip.vision.projector_type") or "mlp"
    vision = bool(meta.get("clip.has_vision_encoder", True))
    return ProjectorFacts(
        label=label,
        projector_type=str(kind).lower(),
        vision=vision,
        image_size=number("image_size"),
        patch_size=number("patch_size"),
        n_embd=number("embedding_length"),
        n_ff=number("feed_forward_length"),
        n_head=number("attention.head_count"),
        n_layer=number("block_count"),
        merge=max(1, number("projector.scale_factor", 1)),
        projection_dim=number("projection_dim", 0),
        weights=weights,
    )
