"""Glue to llama.cpp's C library: its log, the backend, load and context set-up, threadpools.

Everything here is about the lifetime of native objects (model, context, threadpools) and about
what llama.cpp reports while it makes them; the engine builds on these and never repeats them.
"""

from __future__ import annotations

import _thread
import ctypes
import functools
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import llama_cpp as lc
from gguf import GGMLQuantizationType

from localfab.engine.types import BufferSizes, EngineSettings, FlashAttn
from localfab.errors import LoadCancelled, LocalfabError, ModelError, UsageError
from localfab.machine.types import amx_in
from localfab.units import KV_CACHE_TYPES

log = logging.getLogger("localfab.engine")

# The KV cache types localfab offers, as ggml type ids (gguf's enum: the bindings lack BF16).
GGML_TYPES: dict[str, int] = {
    name: int(GGMLQuantizationType[name.upper()]) for name in KV_CACHE_TYPES
}
FLASH_ATTN: dict[FlashAttn, int] = {
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
_LOG_CONT = 5
_log_level = logging.DEBUG
llama_log = logging.getLogger("localfab.llama_cpp")
# Warnings no user can act on, logged at DEBUG (seen with -vv): llama.cpp fixing a token's type
# in the vocabulary (a note to the model's author), notes on its own choices that point to a
# pull request, and the like. An error always keeps its level and its full text.
_NOT_ACTIONABLE = re.compile(
    r"control-looking token|was not control-type|using full-size SWA cache|\(ref: https?://"
)


def shown_level(level: int, line: str) -> int:
    """The logging level one llama.cpp line is logged at (`level`: what llama.cpp gave it)."""
    if level < logging.ERROR and _NOT_ACTIONABLE.search(line):
        return logging.DEBUG
    return level


def _log_line(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # An exception cannot leave a ctypes callback: ctypes prints and drops it. A Ctrl-C whose
    # handler fires while llama.cpp logs would be lost, and `localfab run` would go on
    # generating. Signal it again from another thread a moment later, once this callback has
    # returned (should it land in a callback again, the same happens again).
    try:
        _keep_log_line(level, text)
    except KeyboardInterrupt:
        threading.Timer(0.01, _thread.interrupt_main, args=(signal.SIGINT,)).start()


def _keep_log_line(level: int, text: bytes) -> None:
    global _log_partial, _log_level, _log_dropped
    chunk = text.decode("utf-8", errors="replace")
    with _log_lock:
        if level != _LOG_CONT:
            _log_level = _LOG_LEVELS.get(level, logging.DEBUG)
        data = _log_partial + chunk
        *lines, _log_partial = data.split("\n")
        for line in lines:
            _log_lines.append(line)
            if len(_log_lines) > 20000:  # one load logs ~1,500 lines; keep many loads' worth
                del _log_lines[:10000]
                _log_dropped += 10000
            llama_log.log(shown_level(_log_level, line), "%s", line)


# The ctypes callback object must live as long as llama.cpp may call it: the whole process.
_on_log = lc.llama_log_callback(_log_line)

_backend_lock = threading.Lock()
_backend_ready = False


def ensure_backend() -> None:
    """Initialise llama.cpp once per process, with its log routed to Python logging."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            lc.llama_log_set(_on_log, ctypes.c_void_p(0))
            lc.llama_backend_init()
            _backend_ready = True


def route_log(setter: Any) -> None:
    """Route another llama.cpp library's log (mtmd's, given its `..._log_set`) through the same
    callback, so its lines reach Python logging and `log_since` too."""
    ensure_backend()
    setter(_on_log, ctypes.c_void_p(0))


def log_mark() -> int:
    """A position in llama.cpp's log; `log_since(mark)` returns the lines logged after it."""
    with _log_lock:
        return _log_dropped + len(_log_lines)


def log_since(mark: int) -> list[str]:
    with _log_lock:
        return list(_log_lines[max(0, mark - _log_dropped) :])


def backend_info() -> dict[str, object]:
    """Which backends the installed llama-cpp-python was built with (for the planner/doctor)."""
    ensure_backend()
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


def physical_cores() -> int:
    """Physical cores: llama.cpp is fastest with one thread per core, not per hyper-thread."""
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


# --- threadpools -------------------------------------------------------------------------------


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


def _ggml_libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """The bundled ggml base and CPU libraries, with the threadpool calls declared."""
    global _ggml
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
    return _ggml


def _new_threadpool(n_threads: int) -> int | None:
    """A persistent ggml CPU threadpool, as llama-server attaches; None if unavailable.

    Without one, ggml sets up a throw-away pool state for every graph computation (every token).
    The bindings do not wrap these calls, so they are made on the bundled libraries directly.
    """
    try:
        base, cpu = _ggml_libs()
        params = base.ggml_threadpool_params_default(n_threads)
        params.poll = _THREADPOOL_POLL
        pool = cpu.ggml_threadpool_new(ctypes.byref(params))
        return int(pool) if pool else None
    except (OSError, AttributeError, StopIteration) as exc:
        log.debug("no persistent threadpool (%s); llama.cpp will make its own", exc)
        return None


def attach_threadpools(ctx: Any, n_threads: int, n_threads_batch: int) -> list[int]:
    """Give the context persistent pools for generation and batches; returns them to free."""
    pools: list[int] = []
    pool = _new_threadpool(n_threads)
    if pool is None:
        return pools
    pools.append(pool)
    batch_pool = pool
    if n_threads_batch != n_threads:
        batch_pool = _new_threadpool(n_threads_batch) or pool
        if batch_pool != pool:
            pools.append(batch_pool)
    lc.llama_cpp._lib.llama_attach_threadpool(ctx, pool, batch_pool)
    return pools


def free_threadpools(pools: Sequence[int]) -> None:
    """Free pools made by `attach_threadpools` (after the context that used them is freed)."""
    if _ggml is not None:
        for pool in pools:
            _ggml[1].ggml_threadpool_free(pool)


# --- loading -----------------------------------------------------------------------------------

_BUFFER_RE = re.compile(
    r"(?P<dev>[\w\-]+?)(?P<suffix>_Mapped|_REPACK)?\s+(?P<kind>model|KV|compute|RS)\s+buffer size"
    r"\s*=\s*"
    r"(?P<mib>[\d.]+)\s*MiB"
)


def parse_buffer_sizes(lines: Sequence[str]) -> BufferSizes:
    """Sum the buffer sizes llama.cpp logs while loading ('CPU KV buffer size = 6.00 MiB')."""
    totals = {"model": 0, "KV": 0, "compute": 0, "RS": 0}
    by_device: dict[str, dict[str, int]] = {}
    repacked = 0
    for line in lines:
        m = _BUFFER_RE.search(line)
        if not m:
            continue
        size = round(float(m["mib"]) * 1024 * 1024)
        totals[m["kind"]] += size
        if m["suffix"] == "_REPACK":
            repacked += size
        dev = by_device.setdefault(m["dev"], {})
        dev[m["kind"]] = dev.get(m["kind"], 0) + size
    return BufferSizes(
        model_bytes=totals["model"],
        kv_bytes=totals["KV"] + totals["RS"],
        compute_bytes=totals["compute"],
        by_device=by_device,
        repacked_bytes=repacked,
    )


def load_error(path: Path, lines: Sequence[str], what: str) -> str:
    """Why llama.cpp could not do `what`, from the last error line it logged."""
    errors = [ln.strip() for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    detail = errors[-1] if errors else "no reason given"
    return f"{path}: llama.cpp could not {what} ({detail})"


# llama.cpp's LLAMA_MAX_SEQ: the most sequences one context holds.
MAX_SEQUENCES = 256


def check_settings(s: EngineSettings) -> None:
    """UsageError for settings llama.cpp would reject or crash on."""
    for name, value in (("type_k", s.type_k), ("type_v", s.type_v)):
        if value not in GGML_TYPES:
            raise UsageError(
                f"{name} {value!r} is not a KV cache type; use one of {', '.join(GGML_TYPES)}"
            )
    if s.flash_attn not in FLASH_ATTN:
        raise UsageError(f"flash attention must be auto, on or off, not {s.flash_attn!r}")
    if s.n_ctx < 16:
        raise UsageError(f"context size {s.n_ctx} is too small; use at least 16 tokens")
    if not 1 <= s.n_seq_max <= MAX_SEQUENCES:
        raise UsageError(f"parallel slots must be 1 to {MAX_SEQUENCES}, not {s.n_seq_max}")
    if not s.kv_unified and s.n_ctx // s.n_seq_max < 16:
        raise UsageError(
            f"a context of {s.n_ctx} split over {s.n_seq_max} slots leaves under 16 tokens each; "
            "raise -c, lower -np or share one pool with --kv-unified"
        )


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


# llama.cpp's AMX kernels crash this version on their first tile instruction (SIGILL; the tile
# configuration is not loaded on the threads that compute: ggml-org/llama.cpp#26954) or compute
# wrong results (ggml-org/llama.cpp#16315). They run only on weights in llama.cpp's extra buffer
# types, so a build that has them loads without.
AMX_NOTE = (
    "this llama-cpp-python build has llama.cpp's AMX kernels, which crash or compute wrong "
    "results in this llama.cpp version; loading without repacked weights instead (slower). "
    "For full speed, rebuild it without AMX: CFLAGS='-mno-amx-tile -mno-amx-int8 "
    '-mno-amx-bf16\' CXXFLAGS="$CFLAGS" pip install --force-reinstall --no-deps '
    "--no-cache-dir llama-cpp-python=={version}"
)


@functools.cache
def amx_in_build() -> bool:
    """Whether the installed llama.cpp was compiled with its AMX kernels."""
    return amx_in(str(backend_info()["system_info"]))


@functools.cache
def _say_amx() -> None:  # once per process
    log.warning(AMX_NOTE.format(version=getattr(lc, "__version__", "?")))


def extra_buffers(wanted: bool) -> bool:
    """Whether to load with llama.cpp's extra buffer types (repacked weights, AMX)."""
    if wanted and amx_in_build():
        _say_amx()
        return False
    return wanted


def load_model(
    path: Path, s: EngineSettings, mark: int, progress: Callable[[float], bool] | None
) -> Any:
    """Load the weights; ModelError (or LoadCancelled, or what `progress` raised) on failure."""
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = s.n_gpu_layers
    mparams.use_mmap = s.use_mmap
    mparams.use_extra_bufts = extra_buffers(s.repack and not s.batch_invariant)
    if s.batch_invariant:
        os.environ["GGML_CPU_TILED_MM"] = "0"  # see EngineSettings.batch_invariant
    watcher = _LoadProgress(progress) if progress is not None else None
    if watcher is not None:
        # The ctypes callback object must outlive the call that uses it: it is kept on the
        # watcher, which lives until the load returns.
        mparams.progress_callback = watcher.callback
    model = lc.llama_model_load_from_file(str(path).encode(), mparams)
    if watcher is not None:
        watcher.raise_if_stopped(model)
    if not model:
        raise ModelError(
            load_error(path, log_since(mark), "load it")
            + "; the file may be truncated or corrupt: download it again"
        )
    return model


def new_context(
    model: Any, path: Path, s: EngineSettings, mark: int, n_threads: int, n_threads_batch: int
) -> Any:
    """A context for `model` (`s.n_seq_max` sequences); LocalfabError when llama.cpp cannot make
    it."""
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = s.n_ctx
    cparams.n_batch = s.n_batch
    cparams.n_ubatch = min(s.n_ubatch, s.n_batch)
    cparams.n_seq_max = max(1, s.n_seq_max)
    cparams.kv_unified = s.kv_unified
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads_batch
    cparams.flash_attn_type = FLASH_ATTN[s.flash_attn]
    cparams.type_k = GGML_TYPES[s.type_k]
    cparams.type_v = GGML_TYPES[s.type_v]
    cparams.swa_full = s.swa_full
    cparams.op_offload = s.op_offload
    cparams.no_perf = True
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        raise LocalfabError(
            load_error(path, log_since(mark), "create a context")
            + f"; try a smaller context (-c, now {s.n_ctx}) or a quantized KV cache (-ctk q8_0)"
        )
    return ctx
