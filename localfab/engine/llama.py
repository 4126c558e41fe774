"""The engine: one loaded model driven directly through llama.cpp's C API.

This is the only module that imports `llama_cpp`. It drives decoding itself instead of using
llama-cpp-python's `Llama.create_completion`, which re-detokenizes the whole reply for every new
token, defaults to one thread and leaves flash attention off. Here the sampler is llama.cpp's C
sampler chain, text is detokenized one token at a time, and the KV cache is reused for the longest
common prefix between calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import llama_cpp as lc
import numpy as np
from gguf import GGMLQuantizationType

from localfab.engine.sampling import GuardedSampler
from localfab.engine.text import StopMatcher, Utf8Stream
from localfab.engine.types import (
    BufferSizes,
    Done,
    EngineSettings,
    SamplingParams,
    Timings,
    TokenEvent,
    TokenProbs,
)
from localfab.errors import (
    ContextOverflow,
    LoadCancelled,
    LocalfabError,
    ModelError,
    UsageError,
)
from localfab.modelfile import check_gguf_file
from localfab.units import KV_CACHE_TYPES

log = logging.getLogger("localfab.engine")

# The KV cache types localfab offers, as ggml type ids (gguf's enum: the bindings lack BF16).
_GGML_TYPES = {name: int(GGMLQuantizationType[name.upper()]) for name in KV_CACHE_TYPES}
_FLASH_ATTN = {
    "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


# --- llama.cpp's log ---------------------------------------------------------------------------
# llama.cpp writes its log to stderr unless a callback is set. We route it to Python logging and
# keep the lines of the current load, which carry the buffer sizes it allocated and the reason
# a load failed.

_log_lock = threading.Lock()
_log_lines: list[str] = []
_log_dropped = 0  # lines dropped from the front of _log_lines; marks count all lines ever logged
_log_partial = ""
# ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the last line).
_LOG_LEVELS = {
    0: logging.CRITICAL,
    1: logging.DEBUG,
    2: logging.INFO,
    3: logging.WARNING,
    4: logging.ERROR,
}
_log_level = logging.DEBUG
llama_log = logging.getLogger("localfab.llama_cpp")


@lc.llama_log_callback
def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    global _log_partial, _log_level, _log_dropped
    chunk = text.decode("utf-8", errors="replace")
    with _log_lock:
        if level != 5:
            _log_level = _LOG_LEVELS.get(level, logging.DEBUG)
        data = _log_partial + chunk
        *lines, _log_partial = data.split("\n")
        for line in lines:
            _log_lines.append(line)
            if len(_log_lines) > 20000:  # one load logs ~1,500 lines; keep many loads' worth
                del _log_lines[:10000]
                _log_dropped += 10000
            llama_log.log(_log_level, "%s", line)


_backend_lock = threading.Lock()
_backend_ready = False


def _ensure_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            lc.llama_log_set(_on_log, ctypes.c_void_p(0))
            lc.llama_backend_init()
            _backend_ready = True


def _log_mark() -> int:
    with _log_lock:
        return _log_dropped + len(_log_lines)


def _log_since(mark: int) -> list[str]:
    with _log_lock:
        return list(_log_lines[max(0, mark - _log_dropped) :])


def backend_info() -> dict[str, object]:
    """Which backends the installed llama-cpp-python was built with (for the planner/doctor)."""
    _ensure_backend()
    system_info = (lc.llama_print_system_info() or b"").decode("utf-8", errors="replace")
    backends = ["CPU"]
    for name in ("CUDA", "VULKAN", "HIP", "ROCM", "METAL", "SYCL", "OPENCL", "KOMPUTE"):
        if re.search(rf"\b{name}\b", system_info, re.IGNORECASE):
            backends.append(name.capitalize() if name != "CUDA" else "CUDA")
    return {
        "gpu_offload": bool(lc.llama_supports_gpu_offload()),
        "backends": backends,
        "system_info": system_info,
        "version": getattr(lc, "__version__", "unknown"),
    }


class _ThreadpoolParams(ctypes.Structure):
    """ggml.h's struct ggml_threadpool_params (GGML_MAX_N_THREADS = 512)."""

    _fields_ = [
        ("cpumask", ctypes.c_bool * 512),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


_ggml: tuple[ctypes.CDLL, ctypes.CDLL] | None = None
# llama-server and llama-bench poll at level 50 between graph computations: the worker threads
# spin briefly instead of sleeping, which keeps the per-token handoff cheap.
_THREADPOOL_POLL = 50


def _new_threadpool(n_threads: int) -> int | None:
    """A persistent ggml CPU threadpool, as llama-server attaches; None if unavailable.

    Without one, ggml sets up a throw-away pool state for every graph computation (every token).
    The bindings do not wrap these calls, so they are made on the bundled libraries directly.
    """
    global _ggml
    try:
        if _ggml is None:
            libdir = Path(lc.__file__).parent / "lib"
            base = ctypes.CDLL(str(next(libdir.glob("libggml-base.*"))))
            cpu = ctypes.CDLL(str(next(libdir.glob("libggml-cpu.*"))))
            base.ggml_threadpool_params_default.restype = _ThreadpoolParams
            base.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
            cpu.ggml_threadpool_new.restype = ctypes.c_void_p
            cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(_ThreadpoolParams)]
            cpu.ggml_threadpool_free.restype = None
            cpu.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
            lib = lc.llama_cpp._lib
            lib.llama_attach_threadpool.argtypes = [ctypes.c_void_p] * 3
            lib.llama_attach_threadpool.restype = None
            _ggml = (base, cpu)
        base, cpu = _ggml
        params = base.ggml_threadpool_params_default(n_threads)
        params.poll = _THREADPOOL_POLL
        pool = cpu.ggml_threadpool_new(ctypes.byref(params))
        return int(pool) if pool else None
    except (OSError, AttributeError, StopIteration) as exc:
        log.debug("no persistent threadpool (%s); llama.cpp will make its own", exc)
        return None


def physical_cores() -> int:
    """Physical cores: llama.cpp is fastest with one thread per core, not per hyper-thread."""
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


_BUFFER_RE = re.compile(
    r"(?P<dev>[\w\-]+?)(?:_Mapped|_REPACK)?\s+(?P<kind>model|KV|compute|RS)\s+buffer size\s*=\s*"
    r"(?P<mib>[\d.]+)\s*MiB"
)


def parse_buffer_sizes(lines: Sequence[str]) -> BufferSizes:
    """Sum the buffer sizes llama.cpp logs while loading ('CPU KV buffer size = 6.00 MiB')."""
    totals = {"model": 0, "KV": 0, "compute": 0, "RS": 0}
    by_device: dict[str, dict[str, int]] = {}
    for line in lines:
        m = _BUFFER_RE.search(line)
        if not m:
            continue
        size = round(float(m["mib"]) * 1024 * 1024)
        totals[m["kind"]] += size
        dev = by_device.setdefault(m["dev"], {})
        dev[m["kind"]] = dev.get(m["kind"], 0) + size
    return BufferSizes(
        model_bytes=totals["model"],
        kv_bytes=totals["KV"] + totals["RS"],
        compute_bytes=totals["compute"],
        by_device=by_device,
    )


def _load_error(path: Path, lines: Sequence[str], what: str) -> str:
    errors = [ln.strip() for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    detail = errors[-1] if errors else "no reason given"
    return f"{path}: llama.cpp could not {what} ({detail})"


class _LoadProgress:
    """Bridges llama.cpp's load progress callback to a Python `progress(fraction) -> bool`.

    llama.cpp calls it once per tensor, from the loading thread. An exception in the Python
    callback cannot cross the C boundary: it stops the load and is raised afterwards.
    """

    def __init__(self, progress: Callable[[float], bool]) -> None:
        self._progress = progress
        self.stopped = False
        self.error: BaseException | None = None
        self.callback = lc.llama_progress_callback(self._on_progress)

    def _on_progress(self, fraction: float, _user: ctypes.c_void_p) -> bool:
        if self.stopped:
            return False
        try:
            keep_going = self._progress(min(max(float(fraction), 0.0), 1.0))
        except BaseException as exc:  # re-raised on the loading thread once llama.cpp returns
            self.error = exc
            keep_going = False
        if keep_going is False:
            self.stopped = True
            return False
        return True

    def raise_if_stopped(self, model: object) -> None:
        """After the load: raise what stopped it (llama.cpp has freed the partial model)."""
        if not self.stopped:
            return
        if model:  # stopped at the very end: llama.cpp kept the model, so free it here
            lc.llama_model_free(model)
        if self.error is not None:
            raise self.error
        raise LoadCancelled("the model load was cancelled")


class Engine:
    """One loaded model with its context. Not thread-safe: one generation at a time."""

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
        self.settings = settings or EngineSettings()
        check_gguf_file(self.path)
        _ensure_backend()
        s = self.settings
        for name, value in (("type_k", s.type_k), ("type_v", s.type_v)):
            if value not in _GGML_TYPES:
                raise UsageError(
                    f"{name} {value!r} is not a KV cache type; use one of {', '.join(_GGML_TYPES)}"
                )
        if s.flash_attn not in _FLASH_ATTN:
            raise UsageError(f"flash attention must be auto, on or off, not {s.flash_attn!r}")
        if s.n_ctx < 16:
            raise UsageError(f"context size {s.n_ctx} is too small; use at least 16 tokens")
        # llama.cpp crashes on thread counts below 1 or above ggml's limit: one shared rule.
        from localfab.config import check_threads

        self.n_threads = check_threads(s.n_threads, source="n_threads") or physical_cores()
        self.n_threads_batch = (
            check_threads(s.n_threads_batch, source="n_threads_batch") or self.n_threads
        )

        mark = _log_mark()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = s.n_gpu_layers
        mparams.use_mmap = s.use_mmap
        watcher = _LoadProgress(progress) if progress is not None else None
        if watcher is not None:
            # The ctypes callback object must outlive the call that uses it: it is kept on the
            # watcher, which lives until the load returns.
            mparams.progress_callback = watcher.callback
        self._model = lc.llama_model_load_from_file(str(self.path).encode(), mparams)
        if watcher is not None:
            watcher.raise_if_stopped(self._model)
        if not self._model:
            raise ModelError(
                _load_error(self.path, _log_since(mark), "load it")
                + "; the file may be truncated or corrupt: download it again"
            )
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self._model)

        cparams = lc.llama_context_default_params()
        cparams.n_ctx = s.n_ctx
        cparams.n_batch = s.n_batch
        cparams.n_ubatch = min(s.n_ubatch, s.n_batch)
        cparams.n_seq_max = 1
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads_batch
        cparams.flash_attn_type = _FLASH_ATTN[s.flash_attn]
        cparams.type_k = _GGML_TYPES[s.type_k]
        cparams.type_v = _GGML_TYPES[s.type_v]
        cparams.swa_full = s.swa_full
        cparams.op_offload = s.op_offload
        cparams.no_perf = True
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lc.llama_model_free(self._model)
            self._model = None
            raise LocalfabError(
                _load_error(self.path, _log_since(mark), "create a context")
                + f"; try a smaller context (-c, now {s.n_ctx}) or a quantized KV cache (-ctk q8_0)"
            )
        self.buffers = parse_buffer_sizes(_log_since(mark))
        self._pools: list[int] = []
        pool = _new_threadpool(self.n_threads)
        if pool is not None:
            self._pools.append(pool)
            batch_pool = pool
            if self.n_threads_batch != self.n_threads:
                batch_pool = _new_threadpool(self.n_threads_batch) or pool
                if batch_pool != pool:
                    self._pools.append(batch_pool)
            lc.llama_cpp._lib.llama_attach_threadpool(self._ctx, pool, batch_pool)
        self.n_ctx = lc.llama_n_ctx(self._ctx)
        self.n_batch = lc.llama_n_batch(self._ctx)
        self._mem = lc.llama_get_memory(self._ctx)
        self._batch = lc.llama_batch_init(self.n_batch, 0, 1)
        self._one = lc.llama_batch_init(1, 0, 1)  # the generation step's batch, pre-filled
        self._one.n_tokens = 1
        self._one.n_seq_id[0] = 1
        self._one.seq_id[0][0] = 0
        self._one.logits[0] = 1
        self._logits_address: int | None = None
        self._logits_view: np.ndarray = np.zeros(0, dtype=np.float32)
        # A reused piece buffer for the thread that generates; other threads get their own.
        self._piece_buf = ctypes.create_string_buffer(256)
        self._owner = threading.get_ident()
        # Tokens whose KV cells sit in the cache at positions 0..len-1, in order.
        self._cached: list[int] = []
        self._eog: list[int] | None = None
        if self.settings.warmup:
            self._warmup()
        self._lock = threading.Lock()

    def _warmup(self) -> None:
        """One throw-away decode, as llama-server does at start-up: it pages the weights in and
        sizes the compute graph, so the first real request does not pay for it in its TTFT."""
        lc.llama_set_warmup(self._ctx, True)
        try:
            bos = lc.llama_vocab_bos(self._vocab)
            self._decode([bos if bos >= 0 else 0], 0)
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
        if getattr(self, "_batch", None) is not None:
            lc.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_one", None) is not None:
            lc.llama_batch_free(self._one)
            self._one = None
        if getattr(self, "_ctx", None):
            lc.llama_free(self._ctx)
            self._ctx = None
        if _ggml is not None:
            for pool in getattr(self, "_pools", ()):
                _ggml[1].ggml_threadpool_free(pool)
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
            n = lc.llama_model_meta_key_by_index(self._model, i, buf, len(buf))
            if n < 0:
                continue
            key = buf.value.decode("utf-8", errors="replace")
            n = lc.llama_model_meta_val_str_by_index(self._model, i, buf, len(buf))
            if n < 0:
                continue
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
        return lc.llama_vocab_bos(self._vocab)

    @property
    def eos_token(self) -> int:
        return lc.llama_vocab_eos(self._vocab)

    @property
    def add_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self._vocab))

    def token_text(self, token: int) -> str:
        raw = lc.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    @property
    def can_shift(self) -> bool:
        """Whether KV cells can be moved (False for recurrent and M-RoPE models)."""
        return bool(lc.llama_memory_can_shift(self._mem))

    @property
    def cached_tokens(self) -> list[int]:
        """The tokens whose KV cells are in the cache now, in position order."""
        return list(self._cached)

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
        """The bytes one token stands for (may be part of a UTF-8 character)."""
        buf = (
            self._piece_buf
            if threading.get_ident() == self._owner
            else ctypes.create_string_buffer(256)
        )
        n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """Text of a token sequence in one go (llama.cpp's own detokenizer)."""
        if not tokens:
            return ""
        arr = (lc.llama_token * len(tokens))(*tokens)
        size = max(64, len(tokens) * 16)
        buf = ctypes.create_string_buffer(size)
        n = lc.llama_detokenize(self._vocab, arr, len(tokens), buf, size, False, special)
        if n < 0:
            size = -n
            buf = ctypes.create_string_buffer(size)
            n = lc.llama_detokenize(self._vocab, arr, len(tokens), buf, size, False, special)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def check_tokens(self, tokens: Sequence[int]) -> None:
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise UsageError(f"token id {bad[0]} is out of the vocabulary (0..{self.n_vocab - 1})")

    # --- KV cache ----------------------------------------------------------------------------

    def _decode(self, tokens: Sequence[int], start: int, *, logits_last: bool = True) -> None:
        """Evaluate tokens at positions start.. in batches; their KV cells join the cache."""
        n_batch = self.n_batch
        batch = self._batch
        for off in range(0, len(tokens), n_batch):
            chunk = tokens[off : off + n_batch]
            n = len(chunk)
            token, pos, n_seq, seq_id, logits = (
                batch.token,
                batch.pos,
                batch.n_seq_id,
                batch.seq_id,
                batch.logits,
            )
            p0 = start + off
            for i, tok in enumerate(chunk):
                token[i] = tok
                pos[i] = p0 + i
                n_seq[i] = 1
                seq_id[i][0] = 0
                logits[i] = 0
            if logits_last and off + n >= len(tokens):
                logits[n - 1] = 1
            batch.n_tokens = n
            rc = lc.llama_decode(self._ctx, batch)
            if rc != 0:
                # Keep our view equal to what the cache really holds, then report.
                self._sync_after_failure()
                if rc == 1:
                    raise ContextOverflow(
                        start + len(tokens),
                        self.n_ctx,
                        "the KV cache has no room left for this batch: "
                        "raise the context with -c or shorten the conversation",
                    )
                raise LocalfabError(
                    f"llama.cpp failed to evaluate the prompt (llama_decode returned {rc})"
                )
            del self._cached[p0:]
            self._cached.extend(chunk)

    def _decode_one(self, tok: int) -> None:
        """The decode step of generation: one token, its logits wanted (a pre-filled batch)."""
        one = self._one
        n_past = len(self._cached)
        one.token[0] = tok
        one.pos[0] = n_past
        rc = lc.llama_decode(self._ctx, one)
        if rc != 0:
            self._sync_after_failure()
            raise LocalfabError(f"llama.cpp failed to decode a token (llama_decode returned {rc})")
        self._cached.append(tok)

    def _logits(self) -> np.ndarray:
        """The last output's logits as a numpy view (re-made only if llama.cpp moved them)."""
        ptr = lc.llama_get_logits_ith(self._ctx, -1)
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        if address != self._logits_address:
            self._logits_view = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            self._logits_address = address
        return self._logits_view

    def _rank(self, n: int) -> tuple[tuple[tuple[int, bytes, float], ...], float]:
        """The `n` most likely next tokens (token, piece, logprob) and the log partition sum."""
        logits = self._logits()
        peak = float(logits.max())
        log_z = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
        n = min(n, self.n_vocab)
        best = np.argpartition(logits, -n)[-n:]
        best = best[np.argsort(-logits[best], kind="stable")]
        top = tuple((int(t), self.token_bytes(int(t)), float(logits[t]) - log_z) for t in best)
        return top, log_z

    def _sync_after_failure(self) -> None:
        pos_max = lc.llama_memory_seq_pos_max(self._mem, 0)
        del self._cached[pos_max + 1 :]

    def _common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading tokens the cache shares with `tokens`."""
        cached = self._cached
        n = min(len(cached), len(tokens))
        lcp = 0
        while lcp < n and cached[lcp] == tokens[lcp]:
            lcp += 1
        return lcp

    def _reuse_prefix(self, tokens: Sequence[int], *, need_logits: bool = True) -> int:
        """Drop cache cells past the common prefix with `tokens`; return how many are reused.

        With `need_logits`, a prompt that is wholly cached keeps its last token out, so that
        evaluating it again yields the logits to sample from.
        """
        cached = self._cached
        lcp = self._common_prefix(tokens)
        if need_logits and lcp == len(tokens) and lcp > 0:
            lcp -= 1
        if lcp < len(cached):
            if not lc.llama_memory_seq_rm(self._mem, 0, lcp, -1):
                # Some caches (sliding window without swa_full, recurrent) cannot drop a
                # partial range: start over.
                lc.llama_memory_clear(self._mem, True)
                lcp = 0
            del self._cached[lcp:]
        return lcp

    def clear_cache(self) -> None:
        lc.llama_memory_clear(self._mem, True)
        self._cached.clear()

    def drop_span(self, start: int, end: int) -> None:
        """Remove cached tokens [start, end) and slide the later ones back, without re-processing.

        This is the context shift: RoPE positions of the kept cells are moved by llama.cpp
        (`llama_memory_seq_add`). Raises if the model's cache cannot shift.
        """
        if not 0 <= start <= end <= len(self._cached):
            raise ValueError(
                f"span [{start}, {end}) is outside the cache of {len(self._cached)} tokens"
            )
        if start == end:
            return
        if not self.can_shift:
            raise LocalfabError("this model's KV cache cannot be shifted")
        n_past = len(self._cached)
        if not lc.llama_memory_seq_rm(self._mem, 0, start, end):
            raise LocalfabError("llama.cpp could not remove KV cells for the shift")
        lc.llama_memory_seq_add(self._mem, 0, end, n_past, -(end - start))
        del self._cached[start:end]

    def _align_to(self, target: Sequence[int]) -> tuple[int, int]:
        """Shift the cache so it shares the longest prefix with `target`; no token is evaluated.

        The cache holds [common prefix][span that target no longer has][part target keeps...].
        The span is found by matching where target's continuation after the common prefix
        starts again in the cache; its cells are removed and the later ones moved back.
        Returns (start, end) of the removed span, (0, 0) when nothing was removed.
        """
        cached = self._cached
        a = self._common_prefix(target)
        if a >= len(target) or a >= len(cached) or not self.can_shift:
            return (0, 0)
        rest = target[a:]
        k = min(4, len(rest))
        key = tuple(rest[:k])
        best_b, best_len = 0, 0
        for b in range(a + 1, len(cached) - k + 1):
            if tuple(cached[b : b + k]) != key:
                continue
            m = k
            limit = min(len(cached) - b, len(rest))
            while m < limit and cached[b + m] == rest[m]:
                m += 1
            if m > best_len:
                best_b, best_len = b, m
        # Worth it only when the kept part is longer than what re-processing would cost.
        if best_len < 8:
            return (0, 0)
        self.drop_span(a, best_b)
        return (a, best_b)

    def top_tokens(self, k: int = 5) -> list[tuple[int, float]]:
        """The k most likely next tokens after the last evaluated one, with their logits."""
        logits = lc.llama_get_logits_ith(self._ctx, -1)
        if not logits:
            return []
        import heapq

        values = logits[: self.n_vocab]
        best = heapq.nlargest(k, range(self.n_vocab), key=values.__getitem__)
        return [(t, float(values[t])) for t in best]

    def shift_to(self, target: Sequence[int]) -> tuple[int, int]:
        """Make the cache match `target` as far as a KV shift allows (see `_align_to`)."""
        with self._lock:
            return self._align_to(target)

    def _rebase(self, target: Sequence[int]) -> None:
        """Make the cache hold exactly `target`: shift what can be kept, evaluate the rest."""
        self._align_to(target)
        lcp = self._reuse_prefix(target, need_logits=False)
        if lcp < len(target):
            self._decode(list(target[lcp:]), lcp, logits_last=False)

    # --- generation --------------------------------------------------------------------------

    def _sampler(self, p: SamplingParams) -> GuardedSampler:
        """The samplers for one generation (see `sampling`: a grammar can never abort)."""
        bias = dict(p.logit_bias)
        if p.ignore_eos:
            bias.update({t: float("-inf") for t in self._eog_tokens()})
        if bias:
            self.check_tokens(list(bias))
        return GuardedSampler(self._vocab, self.n_vocab, self.n_ctx, p, bias, self._ctx)

    def _eog_tokens(self) -> list[int]:
        if self._eog is None:
            self._eog = [t for t in range(self.n_vocab) if lc.llama_vocab_is_eog(self._vocab, t)]
        return self._eog

    def stream(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int = -1,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        on_context_full: Callable[[list[int]], Sequence[int] | None] | None = None,
        carry: bytes = b"",
        n_probs: int = 0,
    ) -> Iterator[TokenEvent | Done]:
        """Generate after `prompt`, yielding TokenEvents and finally one Done.

        The KV cache is reused for the longest prefix `prompt` shares with the previous call.
        `cancel` stops generation at the next token. When the window fills during generation,
        `on_context_full(generated)` is asked for the tokens the cache should hold instead of
        prompt + generated[:-1] (a shorter window: the engine shifts the KV cache to it and goes
        on); returning None ends the reply with finish_reason "length", stop_type "context".
        `carry` is the incomplete UTF-8 of a previous reply this one continues; an incomplete
        character at the end of this reply is likewise returned in `Done.pending`, not shown.
        With `n_probs` > 0 every TokenEvent carries the token's log-probability and the
        `n_probs` most likely tokens (`TokenProbs`).
        """
        t_start = time.perf_counter()
        if not prompt:
            raise UsageError("the prompt is empty")
        if max_tokens == 0 or max_tokens < -1:
            raise UsageError(f"max_tokens must be positive or -1 for no limit, not {max_tokens}")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflow(len(prompt), self.n_ctx)
        self.check_tokens(prompt)
        if not self._lock.acquire(blocking=False):
            raise LocalfabError("the engine is busy with another generation")
        self._owner = threading.get_ident()
        sampler = None
        try:
            sampling = sampling or SamplingParams()
            # Plain greedy decoding needs only the arg-max of the logits: numpy finds it in a
            # fraction of the time the C sampler spends building its 262k-entry candidate list.
            fast_greedy = (
                sampling.temperature <= 0
                and not sampling.grammar
                and not sampling.logit_bias
                and sampling.repeat_penalty == 1.0
                and not sampling.frequency_penalty
                and not sampling.presence_penalty
            )
            sampler = None if fast_greedy else self._sampler(sampling)
            n_reused = self._reuse_prefix(prompt)
            new = list(prompt[n_reused:])
            for off in range(0, len(new), self.n_batch):
                if cancel is not None and cancel.is_set():
                    break
                chunk = new[off : off + self.n_batch]
                self._decode(chunk, n_reused + off, logits_last=off + len(chunk) >= len(new))
            if cancel is not None and cancel.is_set():
                t = time.perf_counter()
                timings = Timings(
                    cache_n=n_reused,
                    prompt_n=len(self._cached) - n_reused,
                    prompt_ms=(t - t_start) * 1e3,
                )
                yield Done("", "cancelled", "cancel", (), timings, len(prompt))
                return

            utf8 = Utf8Stream()
            if carry:
                utf8.feed(carry)
            stops = StopMatcher(stop)
            generated: list[int] = []
            parts: list[str] = []
            finish, stop_type = "length", "limit"
            t_first = 0.0
            vocab = self._vocab
            eog = np.array(self._eog_tokens()) if fast_greedy and sampling.ignore_eos else None
            while True:
                ranked = self._rank(n_probs) if n_probs > 0 else None
                if fast_greedy:
                    logits = self._logits()
                    tok = int(logits.argmax())
                    if eog is not None and tok in eog:
                        masked = logits.copy()
                        masked[eog] = -np.inf
                        tok = int(masked.argmax())
                else:
                    assert sampler is not None
                    tok = sampler.sample(self._logits())
                if not generated:
                    t_first = time.perf_counter()
                if lc.llama_vocab_is_eog(vocab, tok):
                    finish, stop_type = "stop", "eos"
                    break
                if sampler is not None:
                    sampler.accept(tok)
                generated.append(tok)
                piece = self.token_bytes(tok)
                text = stops.feed(utf8.feed(piece))
                if text:
                    parts.append(text)
                probs = None
                if ranked is not None:
                    top, log_z = ranked
                    probs = TokenProbs(piece, float(self._logits()[tok]) - log_z, top)
                if stops.matched is not None:
                    yield TokenEvent(tok, text, probs)
                    finish, stop_type = "stop", "word"
                    break
                yield TokenEvent(tok, text, probs)
                if cancel is not None and cancel.is_set():
                    finish, stop_type = "cancelled", "cancel"
                    break
                if len(generated) == max_tokens:
                    break
                if len(self._cached) >= self.n_ctx:
                    target = on_context_full(list(generated)) if on_context_full else None
                    if target is None or len(target) >= self.n_ctx:
                        stop_type = "context"
                        break
                    self._rebase(target)
                self._decode_one(tok)
            pending = b""
            if finish == "length" and stop_type == "limit":
                pending = utf8.pending()  # a continuation may complete the character
            if stops.matched is None:
                tail = stops.feed("" if pending else utf8.flush()) + stops.flush()
                if tail:
                    parts.append(tail)
                    yield TokenEvent(generated[-1] if generated else -1, tail)
            t_end = time.perf_counter()
            if not t_first:
                t_first = t_end
            n_pred = len(generated) + (1 if stop_type == "eos" else 0)
            timings = Timings(
                cache_n=n_reused,
                prompt_n=len(new),
                prompt_ms=(t_first - t_start) * 1e3,
                predicted_n=n_pred,
                predicted_ms=(t_end - t_first) * 1e3,
                ttft_ms=(t_first - t_start) * 1e3,
            )
            yield Done(
                text="".join(parts),
                finish_reason=finish,  # type: ignore[arg-type]
                stop_type=stop_type,
                tokens=tuple(generated),
                timings=timings,
                prompt_tokens=len(prompt),
                stopping_word=stops.matched or "",
                pending=pending,
            )
        finally:
            if sampler is not None:
                sampler.close()
            self._lock.release()

    def generate(self, prompt: Sequence[int], **options: object) -> Done:
        """Like `stream`, returning only the final Done."""
        done: Done | None = None
        for event in self.stream(prompt, **options):  # type: ignore[arg-type]
            if isinstance(event, Done):
                done = event
        assert done is not None
        return done

    def evaluate(self, tokens: Sequence[int]) -> int:
        """Put `tokens` in the cache without generating; returns how many came from the cache."""
        if len(tokens) > self.n_ctx:
            raise ContextOverflow(len(tokens), self.n_ctx)
        self.check_tokens(tokens)
        with self._lock:
            n = self._reuse_prefix(tokens)
            self._decode(list(tokens[n:]), n, logits_last=True)
            return n


def measure_buffers(
    path: str | Path,
    *,
    n_ctx: int,
    n_ubatch: int = 512,
    n_batch: int | None = None,
    flash_attn: str = "auto",
    type_k: str = "f16",
    type_v: str = "f16",
    n_gpu_layers: int = 0,
    swa_full: bool = True,
) -> BufferSizes:
    """Load a model and return the buffer sizes llama.cpp reports (for planner calibration)."""
    settings = EngineSettings(
        n_ctx=n_ctx,
        n_ubatch=n_ubatch,
        n_batch=n_batch or max(n_ubatch, 2048),
        flash_attn=flash_attn,  # type: ignore[arg-type]
        type_k=type_k,
        type_v=type_v,
        n_gpu_layers=n_gpu_layers,
        swa_full=swa_full,
    )
    with Engine(path, settings) as engine:
        return engine.buffers
