"""What the decoding modules see of an engine: the handle `Engine` hands them.

`generation`, `reply`, `batch` and `spec/` drive llama.cpp through this protocol, never through
`Engine` itself, so none of them imports the module that imports them (`llama`). `Engine` is
the one implementation; the protocol only names what the decoding code may touch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from localfab.engine.kvcache import KVCache
from localfab.engine.types import BufferSizes, EngineSettings


class Handle(Protocol):
    """A loaded model and its context, as the token loops drive it."""

    path: Path
    settings: EngineSettings
    n_vocab: int
    n_ctx: int
    n_ctx_total: int
    n_seq_max: int
    n_batch: int
    n_threads: int
    n_threads_batch: int
    buffers: BufferSizes

    @property
    def kv(self) -> KVCache:
        """The engine's own KV sequence (sequence 0)."""

    @property
    def ctx(self) -> Any:
        """llama.cpp's context (a `llama_context_p`)."""

    @property
    def vocab(self) -> Any:
        """llama.cpp's vocabulary of the model (a `llama_vocab_p`)."""

    @property
    def size(self) -> int:
        """Bytes of the model's weights."""

    @property
    def bos_token(self) -> int: ...

    @property
    def eos_token(self) -> int: ...

    def claim(self) -> None:
        """Take the engine for one generation on this thread (see `Engine.claim`)."""

    def release(self) -> None: ...

    def close(self, *, wait: float = 60.0) -> None: ...

    def eog_tokens(self) -> list[int]: ...

    def check_tokens(self, tokens: Sequence[int]) -> None: ...

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]: ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...
