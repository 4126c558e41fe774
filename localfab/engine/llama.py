"""The engine: one loaded model driven directly through llama.cpp's C API.

It drives decoding itself instead of using llama-cpp-python's `Llama.create_completion`, which
re-detokenizes the whole reply for every new token, defaults to one thread and leaves flash
attention off. Here the sampler is llama.cpp's C sampler chain, text is detokenized one token at
a time, and the KV cache is reused for the longest common prefix between calls.

`Engine` is the handle: the model, its context, its tokenizer and its KV sequence, with the
lock one generation holds. The rest is in its own modules: `native` (llama.cpp's log, load and
context set-up, threadpools), `kvcache` (what the cache holds: prefix reuse, shift, rebase),
`sampling` (the sampler chain), `reply` (the token step every path shares), `generation` (the
single-sequence loop), `batch` and `slots` (continuous batching), `spec/` (speculative
decoding) and `grammar/`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp as lc

from localfab.engine import generation, native
from localfab.engine.image_ids import Images
from localfab.engine.kvcache import KVCache
from localfab.engine.native import backend_info, physical_cores
from localfab.engine.types import (
    Done,
    EngineSettings,
    GenerationOptions,
    SpecSettings,
    TokenEvent,
    outside_vocab,
    vocab_message,
)
from localfab.errors import ContextOverflow, LocalfabError, UsageError
from localfab.gguf.modelfile import check_gguf_file

if TYPE_CHECKING:
    from localfab.engine.disk_cache import StateKey
    from localfab.engine.handle import Handle
    from localfab.engine.prompt_cache import PromptCache, Restored
    from localfab.engine.spec import Speculator

__all__ = ["Engine", "backend_info", "physical_cores"]

log = logging.getLogger("localfab.engine")
FIM_TOKENS = ("pre", "suf", "mid", "pad", "rep", "sep")  # llama_vocab_fim_*


class Engine:
    """One loaded model with its context. Not thread-safe: one generation at a time."""

    # What the prompt cache gave back to the last `evaluate` (None: nothing).
    restored: Restored | None = None

    def __init__(
        self,
        path: str | Path,
        settings: EngineSettings | None = None,
        *,
        progress: Callable[[float], bool] | None = None,
    ) -> None:
        """Load the model at `path`.

        `progress`, if given, is called from this thread with the fraction of the weights loaded
        (0.0 to 1.0); returning False stops the load, which raises `LoadCancelled`.
        """
        self.path = Path(path)
        self.settings = s = settings or EngineSettings()
        # Speculative decoding once on (`set_speculation`): each reply's loop is chosen by it.
        self._speculator: Speculator | None = None
        self._exact_batch: dict[int, tuple[int, int]] = {}
        check_gguf_file(self.path)
        native.ensure_backend()
        native.check_settings(s)
        # llama.cpp crashes on thread counts below 1 or above ggml's limit: one shared rule.
        from localfab.config import check_threads

        self.n_threads = check_threads(s.n_threads, source="n_threads") or physical_cores()
        self.n_threads_batch = (
            check_threads(s.n_threads_batch, source="n_threads_batch") or self.n_threads
        )

        mark = native.log_mark()
        self._model: Any = native.load_model(self.path, s, mark, progress)
        self._vocab: Any = lc.llama_model_get_vocab(self._model)
        self.n_vocab: int = lc.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train: int = lc.llama_model_n_ctx_train(self._model)
        try:
            self._ctx: Any = native.new_context(
                self._model, self.path, s, mark, self.n_threads, self.n_threads_batch
            )
        except LocalfabError:
            lc.llama_model_free(self._model)
            self._model = None
            raise
        self.buffers = native.parse_buffer_sizes(native.log_since(mark))
        self._pools = native.attach_threadpools(self._ctx, self.n_threads, self.n_threads_batch)
        # What one sequence may hold (all of it unless parallel slots split the context), and
        # the context's whole size.
        self.n_ctx: int = lc.llama_n_ctx_seq(self._ctx)
        self.n_ctx_total: int = lc.llama_n_ctx(self._ctx)
        self.n_seq_max: int = lc.llama_n_seq_max(self._ctx)
        self.n_batch: int = lc.llama_n_batch(self._ctx)
        self._kv = KVCache(
            self._ctx, self.n_ctx, self.n_batch, self.n_vocab, shared=self.n_seq_max > 1
        )
        # A reused piece buffer for the thread that generates; other threads get their own.
        self._piece_buf = ctypes.create_string_buffer(256)
        self._owner = threading.get_ident()
        self._eog: list[int] | None = None
        self.projector: Images | None = None  # a vision model's (`vision.attach_projector`)
        if self.settings.warmup:
            self._warmup()
        self._lock = threading.Lock()

    # --- the handle: what the decoding modules drive ------------------------------------------

    @property
    def kv(self) -> KVCache:
        """The engine's own KV sequence (sequence 0)."""
        return self._kv

    @property
    def ctx(self) -> Any:
        """llama.cpp's context (a `llama_context_p`)."""
        return self._ctx

    @property
    def model(self) -> Any:
        """llama.cpp's model (a `llama_model_p`)."""
        return self._model

    @property
    def vocab(self) -> Any:
        """llama.cpp's vocabulary of the model (a `llama_vocab_p`)."""
        return self._vocab

    @property
    def speculator(self) -> Speculator | None:
        """The speculative decoding in use (see `set_speculation`); None when off."""
        return self._speculator

    def claim(self) -> None:
        """Take the engine for one generation on this thread; LocalfabError when another
        generation holds it. `release` gives it back."""
        if not self._lock.acquire(blocking=False):
            raise LocalfabError("the engine is busy with another generation")
        self._owner = threading.get_ident()

    def release(self) -> None:
        self._lock.release()

    def _warmup(self) -> None:
        """One throw-away decode, as llama-server does at start-up: it pages the weights in and
        sizes the compute graph, so the first real request does not pay for it in its TTFT."""
        lc.llama_set_warmup(self._ctx, True)
        try:
            bos = lc.llama_vocab_bos(self._vocab)
            self._kv.decode([bos if bos >= 0 else 0], 0)
        finally:
            lc.llama_set_warmup(self._ctx, False)
            self.clear_cache()

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self, *, wait: float = 60.0) -> None:
        """Free the context and model; the engine cannot be used afterwards.

        A generation still running on another thread (a server worker whose client has not been
        cancelled yet) holds the engine's lock: freeing under it would crash the process, so
        close waits up to `wait` seconds for it and otherwise leaves the memory to the OS.
        """
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before the lock existed
            self._free()
            return
        if not lock.acquire(timeout=max(wait, 0.0)):
            log.warning("engine still generating after %.0f s; not freeing it", wait)
            return
        try:
            self._free()
        finally:
            lock.release()

    def _free(self) -> None:
        spec: Speculator | None = getattr(self, "_speculator", None)
        if spec is not None:
            spec.close()
            self._speculator = None
        if (projector := getattr(self, "projector", None)) is not None:
            projector.close()  # before the model it belongs to
        kv: KVCache | None = getattr(self, "_kv", None)
        if kv is not None:
            kv.free()
        if getattr(self, "_ctx", None):
            lc.llama_free(self._ctx)
            self._ctx = None
        native.free_threadpools(getattr(self, "_pools", ()))
        self._pools = []
        if getattr(self, "_model", None):
            lc.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        lock = getattr(self, "_lock", None)
        if lock is not None and not lock.acquire(blocking=False):
            return  # a thread is still generating: never free under it
        with contextlib.suppress(Exception):
            self._free()
        if lock is not None:
            lock.release()

    # --- model facts -------------------------------------------------------------------------

    def metadata(self) -> dict[str, str]:
        """The GGUF metadata as llama.cpp reads it (arrays are summarized by llama.cpp)."""
        out: dict[str, str] = {}
        buf = ctypes.create_string_buffer(1 << 16)
        for i in range(lc.llama_model_meta_count(self._model)):
            if lc.llama_model_meta_key_by_index(self._model, i, buf, len(buf)) < 0:
                continue
            key = buf.value.decode("utf-8", errors="replace")
            if lc.llama_model_meta_val_str_by_index(self._model, i, buf, len(buf)) >= 0:
                out[key] = buf.value.decode("utf-8", errors="replace")
        return out

    def chat_template(self) -> str | None:
        raw = lc.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    @property
    def architecture(self) -> str:
        return self.metadata().get("general.architecture", "")

    @property
    def n_params(self) -> int:
        return int(lc.llama_model_n_params(self._model))

    @property
    def size(self) -> int:
        """Bytes of all tensors."""
        return int(lc.llama_model_size(self._model))

    @property
    def bos_token(self) -> int:
        return int(lc.llama_vocab_bos(self._vocab))

    @property
    def eos_token(self) -> int:
        return int(lc.llama_vocab_eos(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self._vocab))

    def fim_tokens(self) -> dict[str, int]:
        """The fill-in-the-middle tokens (pre, suf, mid, pad, rep, sep) the vocabulary has."""
        ids = {n: int(getattr(lc, f"llama_vocab_fim_{n}")(self._vocab)) for n in FIM_TOKENS}
        return {name: token for name, token in ids.items() if token >= 0}

    def token_text(self, token: int) -> str:
        raw = lc.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token of the vocabulary (worked out once)."""
        if self._eog is None:
            vocab = self._vocab
            self._eog = [t for t in range(self.n_vocab) if lc.llama_vocab_is_eog(vocab, t)]
        return self._eog

    # --- tokens ------------------------------------------------------------------------------

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (lc.llama_token * n_max)()
        n = lc.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (lc.llama_token * n_max)()
            n = lc.llama_tokenize(
                self._vocab, data, len(data), buf, n_max, add_special, parse_special
            )
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The bytes one token stands for (may be part of a UTF-8 character); an image's id
        (`image_ids`) stands for none."""
        if token < 0:
            return b""
        own = threading.get_ident() == self._owner
        buf = self._piece_buf if own else ctypes.create_string_buffer(256)
        n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of a token sequence in one go (llama.cpp's own detokenizer; images' ids aside)."""
        tokens = [t for t in tokens if t >= 0] if min(tokens, default=0) < 0 else tokens
        if not tokens:
            return ""
        arr = (lc.llama_token * len(tokens))(*tokens)
        size = max(64, len(tokens) * 16)
        buf = ctypes.create_string_buffer(size)
        n = lc.llama_detokenize(self._vocab, arr, len(tokens), buf, size, False, special)
        if n < 0:
            size, buf = -n, ctypes.create_string_buffer(-n)
            n = lc.llama_detokenize(self._vocab, arr, len(tokens), buf, size, False, special)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def check_tokens(self, tokens: Sequence[int]) -> None:
        """UsageError for a token id outside the vocabulary (image ids aside, with a projector)."""
        bad = outside_vocab(
            [t for t in tokens if t >= 0] if self.projector else tokens, self.n_vocab
        )
        if bad is not None:
            raise UsageError(vocab_message(bad, self.n_vocab))

    # --- KV cache (see `kvcache`) ------------------------------------------------------------

    @property
    def can_shift(self) -> bool:
        """Whether KV cells can be moved (False for recurrent and M-RoPE models)."""
        return self._kv.can_shift

    @property
    def cached_tokens(self) -> list[int]:
        """The tokens whose KV cells are in the cache now, in position order."""
        return list(self._kv.cached)

    def clear_cache(self) -> None:
        self._kv.clear()

    def drop_span(self, start: int, end: int) -> None:
        """The context shift: cached tokens [start, end) leave (`KVCache.drop_span`)."""
        self._kv.drop_span(start, end)

    def shift_to(self, target: Sequence[int]) -> tuple[int, int]:
        """Make the cache match `target` as far as a KV shift allows (see `KVCache.align_to`)."""
        with self._lock:
            return self._kv.align_to(target)

    def top_tokens(self, k: int = 5) -> list[tuple[int, float]]:
        """The k most likely next tokens after the last evaluated one, with their logits
        (none when its logits were not computed)."""
        row = self._kv.last_row()
        if row is None:
            return []
        logits = lc.llama_get_logits_ith(self._ctx, row)
        if not logits:
            return []
        import heapq

        values = logits[: self.n_vocab]
        best = heapq.nlargest(k, range(self.n_vocab), key=values.__getitem__)
        return [(t, float(values[t])) for t in best]

    def evaluate(self, tokens: Sequence[int]) -> int:
        """Put `tokens` in the cache without generating; returns how many came from the cache."""
        if len(tokens) > self.n_ctx:
            raise ContextOverflow(len(tokens), self.n_ctx)
        self.check_tokens(tokens)
        with self._lock:
            self.restored = self._kv.swap_with_cache(tokens)
            return self._kv.evaluate(tokens)

    def use_prompt_cache(self, cache: PromptCache | None) -> None:
        """The prompt cache of this engine's sequence (`KVCache.swap_with_cache`; None: off),
        and one beside it for a draft model's (set speculation first); slots: `server.slots`."""
        self._kv.prompt_cache = cache
        draft = self.draft_engine
        if isinstance(draft, Engine):
            draft.kv.prompt_cache = None if cache is None else cache.beside(draft.state_key())

    @property
    def prompt_cache(self) -> PromptCache | None:
        return self._kv.prompt_cache

    def persist_prompt(self, slack: int = 0) -> int:
        """Write what the cache holds to the prompt cache's disk tier (`KVCache.persist`: a
        chat gone idle, the app quitting, `run` ending); the bytes written."""
        with self._lock:
            draft = self.draft_engine
            if draft is not None:
                draft.kv.persist(slack)
            return self._kv.persist(slack)

    def state_key(self) -> StateKey:
        """What a saved KV state of this engine depends on (the disk tier's key)."""
        from localfab.engine.disk_cache import state_key

        return state_key(self.path, self.settings, self.n_ctx, self.n_seq_max)

    # --- speculative decoding (see `spec`) ---------------------------------------------------

    @property
    def speculation(self) -> SpecSettings | None:
        """The speculative decoding in use, None when off."""
        return None if self._speculator is None else self._speculator.settings

    @property
    def speculation_batch(self) -> int:
        """The most tokens one verify holds (the pending one and the draft); 0 when off."""
        return 0 if self._speculator is None else self._speculator.max_batch

    @property
    def speculation_batch_past(self) -> int:
        """The same once the cache holds more than `ONE_THREAD_CELLS` (`exact_batch`)."""
        return 0 if self._speculator is None else self._speculator.max_batch_past

    @property
    def draft_engine(self) -> Handle | None:  # the draft model's with "draft-simple"
        return None if self._speculator is None else self._speculator.draft_engine

    def load_draft(self, path: str | Path, n_gpu_layers: int | None = None) -> Engine:
        """Load a draft model for this engine; UsageError/ModelError if it cannot draft here."""
        from localfab.engine.spec.draft_model import load_draft

        return load_draft(str(path), self, n_gpu_layers, Engine)

    def set_speculation(self, settings: SpecSettings | None, draft: Engine | None = None) -> None:
        """Use speculative decoding for the following replies (None or spec type "none": off).

        "draft-simple" needs `draft` (see `load_draft`); the engine owns it from here on and
        closes it with itself or when speculation changes. Turning it on measures how many
        tokens one verify may hold (`exactness.exact_batch`), which clears the cache; load the
        engine as `SpecSettings.load_settings` says for long verifies.
        """
        if settings is not None and settings.enabled:
            settings.check()
            if settings.spec_type == "draft-simple" and draft is None:
                raise UsageError("draft-simple speculation needs a loaded draft model")
        with self._lock:
            old = self._speculator
            self._speculator = None
            if settings is not None and settings.enabled:
                from localfab.engine.spec import Speculator
                from localfab.engine.spec.exactness import exact_batch

                use = draft if settings.spec_type == "draft-simple" else None
                n = min(settings.max_draft + 1, self.n_batch)
                if settings.exact and n not in self._exact_batch:  # once per engine and size
                    self._exact_batch[n] = exact_batch(self, n)
                within, past = self._exact_batch[n] if settings.exact else (n, n)
                self._speculator = Speculator(settings, use, within, past)
            if old is not None and old.draft_engine is not draft:
                old.close()

    # --- generation (see `generation`) -------------------------------------------------------

    def stream(
        self, prompt: Sequence[int], options: GenerationOptions | None = None, **fields: Any
    ) -> Iterator[TokenEvent | Done]:
        """Generate after `prompt`, yielding TokenEvents and finally one Done.

        What to generate is `options`, or, as a shorthand, its fields as keywords
        (`stream(tokens, max_tokens=8)` is `stream(tokens, GenerationOptions(max_tokens=8))`).
        The KV cache is reused for the longest prefix `prompt` shares with the previous call.
        An incomplete UTF-8 character at the end of a reply cut by `max_tokens` is returned in
        `Done.pending`, not shown, for a continuation to `carry`. Checks happen when the first
        event is asked for: a UsageError or ContextOverflow is raised there.
        """
        if fields:
            if options is not None:
                raise TypeError("pass generation options as `options` or as keywords, not both")
            options = GenerationOptions(**fields)
        return generation.stream(self, prompt, options or GenerationOptions())

    def generate(
        self, prompt: Sequence[int], options: GenerationOptions | None = None, **keywords: Any
    ) -> Done:
        """Like `stream` (same options and keywords), returning only the final Done."""
        done: Done | None = None
        for event in self.stream(prompt, options, **keywords):
            if isinstance(event, Done):
                done = event
        assert done is not None
        return done
