"""Images in a prompt, through llama.cpp's multimodal library (mtmd) and a vision projector.

A vision model ships its projector (an `mmproj` GGUF) beside its weights: it turns an image
into embeddings in the text model's space. `Projector.image_tokens` checks an image's bytes
(format, size, before anything is decoded), lets mtmd prepare it (resized to the projector's
size) and gives the tokens it takes in a prompt: the model's own image markers around a run of
image ids (`image_ids`). Those stand in a sequence's token list like text; when a run of them is
evaluated (`KVCache.decode` hands prompts that hold one to `Projector.decode`), the projector
encodes the image and llama.cpp decodes its embeddings into the sequence's cells at those
positions. The same image again (the next turn of a chat) is found in the cache by its ids and
not encoded again; `n_encoded` counts the encodings.

Prepared images are kept for a while (a chat sends its images again every turn), the oldest
freed first; an image a request's prompt still needs (`ImageHold`: queued or running) is never
freed, however many other images come meanwhile.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import llama_cpp as lc
import llama_cpp.mtmd_cpp as mtmd

from localfab.engine import native
from localfab.engine.image_header import image_size
from localfab.engine.image_ids import ImageHold, image_end, index_in_image, run_ids
from localfab.errors import LocalfabError
from localfab.gguf.modelfile import check_gguf_file
from localfab.units import MiB

if TYPE_CHECKING:
    from localfab.engine.kvcache import KVCache


class Host(Protocol):
    """The engine a projector is attached to (`engine.Engine`)."""

    model: Any
    ctx: Any
    n_threads: int
    kv: KVCache
    projector: Any


# Prepared images no request needs any more that are kept for the next turn of a chat, the oldest
# freed first (each holds its resized pixels); a request's own are pinned (`ImageHold`) besides.
KEPT_IMAGES = 32
NO_PROGRAMS = b"/nonexistent/localfab-runs-no-video-decoder"


class Projector:
    """A vision projector loaded beside a model, on the context `ctx` (see the module doc)."""

    def __init__(
        self, model: Any, ctx: Any, path: Path, *, n_threads: int, use_gpu: bool = True
    ) -> None:
        check_gguf_file(path)
        native.route_log(mtmd.mtmd_helper_log_set)
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        # As llama-server: the compute buffer is reserved at load, for the largest image (so a
        # projector that does not fit fails here, not at the first image).
        params.warmup = True
        mark = native.log_mark()
        self._mctx: Any = mtmd.mtmd_init_from_file(str(path).encode(), model, params)
        if not self._mctx:
            raise LocalfabError(
                f"cannot use {path.name} as this model's projector: {_reason(mark)}"
            )
        if not mtmd.mtmd_support_vision(self._mctx):
            self.close()
            raise LocalfabError(f"{path.name} is a projector that reads no images")
        self.path = path
        # What llama.cpp says it holds: the weights' bytes and the compute buffers' (the plan's
        # figures are checked against these).
        self.weights_bytes, self.compute_bytes = _reported(native.log_since(mark))
        self._ctx = ctx
        self.n_ubatch = int(lc.llama_n_ubatch(ctx))
        self.marker = (mtmd.mtmd_default_marker() or b"<__media__>").decode()
        self.n_ctx = int(lc.llama_n_ctx(ctx))
        # Requests' threads prepare images while the engine thread evaluates them.
        self._lock = threading.Lock()
        # first image id of a run -> the prepared image (an mtmd chunk this object owns)
        self._images: OrderedDict[int, Any] = OrderedDict()
        # an image's content hash -> its tokens, while its prepared image is kept: a chat
        # sends its images again every turn, and they are not decoded and resized again
        self._tokens: dict[str, list[int]] = {}
        # first image id -> the holds (and evaluations) that need it: never freed while > 0
        self._pins: Counter[int] = Counter()
        self._unpinned: deque[set[int]] = deque()  # dropped holds' images, to let go of
        self.n_encoded = 0  # images the projector encoded (each reuse of one saves one)

    def close(self) -> None:
        """Free the prepared images and the projector (before the model it was loaded with)."""
        with self._lock:
            for chunk in self._images.values():
                mtmd.mtmd_input_chunk_free(chunk)
            self._images.clear()
            self._tokens.clear()
            self._pins.clear()
        if self._mctx:
            mtmd.mtmd_free(self._mctx)
            self._mctx = None

    @property
    def n_kept(self) -> int:
        """Prepared images held now (pinned or kept for a later turn)."""
        return len(self._images)

    # --- pins ----------------------------------------------------------------------------------

    def hold(self) -> ImageHold:
        """A new hold for one request's images (`image_tokens`)."""
        return ImageHold(self._unpin)

    def _unpin(self, firsts: set[int], wait: bool) -> None:
        self._unpinned.append(firsts)
        # Not waiting: the collector may run this on a thread inside the lock, which then lets
        # the images go as it leaves it.
        if self._lock.acquire(blocking=wait):
            try:
                self._settle()
            finally:
                self._lock.release()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            finally:
                self._settle()

    def _settle(self) -> None:
        """Let go of the images of holds released or dropped, then free the oldest images
        beyond `KEPT_IMAGES` that nothing pins (called inside the lock)."""
        while self._unpinned:
            for first in self._unpinned.popleft():
                self._pins[first] -= 1
                if self._pins[first] <= 0:
                    del self._pins[first]
        unpinned = [first for first in self._images if first not in self._pins]
        for first in unpinned[: max(0, len(unpinned) - KEPT_IMAGES)]:
            mtmd.mtmd_input_chunk_free(self._images.pop(first))
        if len(self._tokens) > 2 * max(KEPT_IMAGES, len(self._images)):
            held = set(self._images)  # drop the hashes of images no longer kept
            self._tokens = {d: t for d, t in self._tokens.items() if t[self._first(t)] in held}

    def _pin(self, hold: ImageHold | None, tokens: list[int]) -> None:
        """Pin the image whose tokens are `tokens` for `hold` (inside the lock); LocalfabError
        when the request's images would take more than the whole context."""
        first = tokens[self._first(tokens)]
        if hold is None or first in hold.firsts:
            return
        n = sum(1 for t in tokens if t < 0)
        # A request pins what it sends, but never more than its prompt could hold (beyond the
        # images any request may have kept): so their memory stays that of one full context.
        if len(hold) >= KEPT_IMAGES and hold.n_tokens + n > self.n_ctx:
            raise LocalfabError(
                f"the request's images take more than the context's {self.n_ctx} tokens: "
                "send fewer images (or start the server with a larger -c)"
            )
        hold.firsts.add(first)
        hold.n_tokens += n
        self._pins[first] += 1

    # --- images to tokens ----------------------------------------------------------------------

    def image_tokens(self, data: bytes, *, hold: ImageHold | None = None) -> list[int]:
        """The tokens an image takes in a prompt: the model's markers around its image ids;
        with `hold`, the prepared image is kept until the hold lets it go. LocalfabError, in
        one line, for what is not an image, a corrupt one, or one too big."""
        fmt, _, _ = image_size(data)
        digest = hashlib.sha256(data).hexdigest()
        with self._locked():
            known = self._tokens.get(digest)
            if known is not None and known[self._first(known)] in self._images:
                self._images.move_to_end(known[self._first(known)])
                self._pin(hold, known)
                return list(known)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        # An image stb_image cannot decode would go on to ffmpeg's video reader: never (a
        # folder that does not exist as ffmpeg's, so no program runs on what a client sent).
        opt = mtmd.mtmd_helper_init_opt_default()
        opt.video_params.ffmpeg_bin_dir = NO_PROGRAMS
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._mctx, buf, len(data), False, opt)
        if not bitmap:
            raise LocalfabError(f"the {fmt} image could not be decoded: corrupt or cut short")
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            text = self.marker.encode()
            part = mtmd.mtmd_input_text(text, len(text), False, True)
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            rc = mtmd.mtmd_tokenize(self._mctx, chunks, ctypes.byref(part), bitmaps, 1)
            if rc != 0:
                raise LocalfabError(f"the projector could not prepare the {fmt} image ({rc})")
            out: list[int] = []
            prepared: list[tuple[int, Any]] = []
            for i in range(mtmd.mtmd_input_chunks_size(chunks)):
                out += self._tokens_of(mtmd.mtmd_input_chunks_get(chunks, i), digest, prepared)
            with self._locked():
                for first, chunk in prepared:
                    self._keep(first, chunk)
                self._tokens[digest] = out
                self._pin(hold, out)
            return list(out)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            mtmd.mtmd_bitmap_free(bitmap)

    @staticmethod
    def _first(tokens: list[int]) -> int:
        """Where the image's ids start among its tokens (after the model's marker)."""
        return next(i for i, t in enumerate(tokens) if t < 0)

    def _tokens_of(
        self, chunk: Any, data_digest: str, prepared: list[tuple[int, Any]]
    ) -> list[int]:
        if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            count = ctypes.c_size_t()
            tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            return [int(tokens[j]) for j in range(count.value)] if tokens else []
        if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            raise LocalfabError("the projector gave audio for an image")
        n = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        if int(mtmd.mtmd_input_chunk_get_n_pos(chunk)) != n:
            raise LocalfabError(
                "this projector places images on a grid of positions (M-RoPE), not supported yet"
            )
        if mtmd.mtmd_decode_use_non_causal(self._mctx, chunk) and n > self.n_ubatch:
            # llama.cpp aborts the process on a non-causal batch larger than a micro-batch.
            raise LocalfabError(
                f"an image takes {n} tokens with this projector, more than the micro-batch "
                f"(-ub {self.n_ubatch}): start with -ub {n} or more"
            )
        ids = run_ids((mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode() or data_digest, n)
        prepared.append((ids[0], chunk))
        return ids

    def _keep(self, first: int, chunk: Any) -> None:
        """Keep a copy of a prepared image (inside the lock; `_settle` frees the oldest)."""
        if first in self._images:
            self._images.move_to_end(first)
            return
        self._images[first] = mtmd.mtmd_input_chunk_copy(chunk)

    # --- evaluation ----------------------------------------------------------------------------

    def decode(self, kv: KVCache, tokens: Sequence[int], start: int, *, logits_last: bool) -> None:
        """Evaluate `tokens` (text and image runs) at positions start.. of `kv`'s sequence."""
        if logits_last and tokens and tokens[-1] < 0:
            raise LocalfabError("a prompt cannot end with an image: text must follow it")
        i = 0
        while i < len(tokens):
            if tokens[i] >= 0:
                j = i
                while j < len(tokens) and tokens[j] >= 0:
                    j += 1
                kv.decode(tokens[i:j], start + i, logits_last=logits_last and j == len(tokens))
            else:
                j = image_end(tokens, i + 1)
                self._evaluate(kv, tokens[i:j], start + i)
            i = j

    def _evaluate(self, kv: KVCache, run: Sequence[int], pos: int) -> None:
        first = run[0]
        with self._locked():
            chunk = self._images.get(first) if index_in_image(first) == 0 else None
            if chunk is None or int(mtmd.mtmd_input_chunk_get_n_tokens(chunk)) != len(run):
                raise LocalfabError("an image of this prompt is no longer held: send it again")
            self._images.move_to_end(first)
            self._pins[first] += 1  # not freed by a request's thread while it is encoded
        try:
            new_past = lc.llama_pos(0)
            rc = mtmd.mtmd_helper_eval_chunk_single(
                self._mctx, self._ctx, chunk, pos, kv.seq, kv.n_batch, False, ctypes.byref(new_past)
            )
        finally:
            self._unpin({first}, True)
        if rc != 0:
            kv.sync_after_failure()
            raise LocalfabError(f"llama.cpp could not evaluate the image ({rc})")
        self.n_encoded += 1
        del kv.cached[pos:]
        kv.cached.extend(run)


def attach_projector(engine: Host, path: Path, *, use_gpu: bool = True) -> Projector:
    """Load a vision projector beside `engine`'s model: its prompts may then hold images (its
    own sequence's; a server's slots get it from their runner). LocalfabError, in one line,
    when the file is not a projector for this model."""
    projector = Projector(
        engine.model, engine.ctx, path, n_threads=engine.n_threads, use_gpu=use_gpu
    )
    engine.projector = projector
    engine.kv.images = projector
    return projector


def _reason(mark: int) -> str:
    """Why mtmd refused a projector, from the log lines since `mark`."""
    lines = [line.strip() for line in native.log_since(mark) if line.strip()]
    if any("failed to load clip model" in line.lower() for line in lines):
        return "llama.cpp's loader refused it: is it a vision projector (an mmproj-*.gguf)?"
    for k, line in enumerate(lines):
        if "error:" in line:
            reason = line.split("error:", 1)[1].strip()
            hint = next((h for h in lines[k + 1 : k + 2] if h.startswith("hint:")), "")
            return f"{reason} ({hint})" if hint else reason
    return "llama.cpp could not load it (run with -v to see why)"


def _reported(lines: Sequence[str]) -> tuple[int, int]:
    """The projector's weights and compute buffers in bytes, as llama.cpp logged them at load
    ("model size: 0.48 MiB", "CPU compute buffer size = 0.23 MiB"); 0 where not logged."""
    weights = compute = 0.0
    for line in lines:
        if "flash attention not supported" in line:
            compute = 0.0  # reserved again without it: the second reservation is the one kept
        found = re.search(r"model size:\s+([\d.]+) MiB", line)
        if found:
            weights = float(found.group(1))
        found = re.search(r"compute buffer size =\s+([\d.]+) MiB", line)
        if found:
            compute += float(found.group(1))
    return round(weights * MiB), round(compute * MiB)
