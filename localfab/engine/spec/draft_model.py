"""Loading a draft model for an engine, and checking that it tokenizes as the engine does."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import llama_cpp as lc

from localfab.engine.types import EngineSettings

if TYPE_CHECKING:
    from localfab.engine.handle import Handle

H = TypeVar("H", bound="Handle")


def load_draft(
    path: str,
    target: Handle,
    n_gpu_layers: int | None,
    open_engine: Callable[[str, EngineSettings], H],
) -> H:
    """Load the draft model for `target` with `open_engine` (the `Engine` class);
    ModelError/UsageError when it cannot draft for it."""
    from localfab.errors import UsageError
    from localfab.units import format_bytes

    s = target.settings
    settings = EngineSettings(
        # As many sequences as the model (a server's slots each draft in their own).
        n_ctx=target.n_ctx_total,
        n_seq_max=target.n_seq_max,
        kv_unified=s.kv_unified,
        n_gpu_layers=s.n_gpu_layers if n_gpu_layers is None else n_gpu_layers,
        n_threads=target.n_threads,
        n_threads_batch=target.n_threads_batch,
        n_batch=min(s.n_batch, 512),
        n_ubatch=min(s.n_ubatch, 512),
        flash_attn=s.flash_attn,
        swa_full=True,
        warmup=s.warmup,
    )
    draft = open_engine(path, settings)
    try:
        check_vocab(draft, target)
        if draft.size > target.size:
            raise UsageError(
                f"the draft model {path} ({format_bytes(draft.size)}) is larger than the "
                f"model ({format_bytes(target.size)}): it would slow decoding down; "
                "pick a smaller draft model"
            )
    except BaseException:
        draft.close()
        raise
    return draft


# llama.cpp's speculative example allows this many extra tokens in one of the vocabularies.
_VOCAB_SLACK = 128


def check_vocab(draft: Handle, target: Handle) -> None:
    """UsageError unless `draft` tokenizes as `target` does (llama.cpp's own checks)."""
    from localfab.errors import UsageError

    where = f"the draft model {draft.path.name} cannot draft for {target.path.name}"
    dv, tv = draft.vocab, target.vocab
    if lc.llama_vocab_type(dv) != lc.llama_vocab_type(tv):
        raise UsageError(f"{where}: its tokenizer is of another kind")
    if abs(draft.n_vocab - target.n_vocab) > _VOCAB_SLACK:
        raise UsageError(
            f"{where}: its vocabulary has {draft.n_vocab} tokens, the model's {target.n_vocab}"
        )
    if draft.bos_token != target.bos_token or draft.eos_token != target.eos_token:
        raise UsageError(f"{where}: its start and end tokens differ")
    n = min(draft.n_vocab, target.n_vocab)
    step = max(1, math.ceil(n / 8192))  # a sample across the whole vocabulary
    for t in range(5, n, step):
        if lc.llama_vocab_get_text(dv, t) != lc.llama_vocab_get_text(tv, t):
            raise UsageError(f"{where}: token {t} differs between the vocabularies")
