"""A scripted stand-in for the llama.cpp engine, for pilot tests and the TUI benchmark.

`FakeEngine` speaks the engine's interface as `ChatSession` uses it (tokenize, stream, shift,
evaluate), so the app's real chat path (window fitting, context shift, continuation, history)
runs unchanged on top of it; only token generation is scripted. Replies come from a function of
the last user message, one small text piece per token, at a set pace.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from localfab.chat.templates import BUILTIN_TEMPLATES
from localfab.engine.callsyntax import CallDelta
from localfab.engine.image_header import image_size
from localfab.engine.image_ids import run_ids
from localfab.engine.thought import ThoughtStep
from localfab.engine.toolcalls import ToolStep
from localfab.engine.types import (
    ContextFull,
    Done,
    FinishReason,
    GenerationOptions,
    StopType,
    Timings,
    TokenEvent,
)
from localfab.errors import ModelError
from localfab.tui.backend import LoadProgress, ModelCard, ProgressCallback
from localfab.tui.local_backend import ChatModel, LoadCancelled

SPECIALS = ("<bos>", "<eos>", "<|im_start|>", "<|im_end|>")
_SPECIAL_RE = re.compile("|".join(re.escape(s) for s in SPECIALS))
# Word-ish pieces of at most six characters, like a small BPE vocabulary.
_PIECE_RE = re.compile(r" ?[^\s]{1,6}|\s")
_ASSISTANT = "<|im_start|>assistant\n"
_USER = "<|im_start|>user\n"

SAMPLE_REPLY = """Here is a short answer with a table and some code.

| model | size | tok/s |
|-------|-----:|------:|
| gemma3:270m | 241 MB | 180 |
| qwen3:4b | 2.5 GB | 32 |

```python
def greet(name: str) -> str:
    return f"hello, {name}"
```

中文也可以：模型在本地运行。
"""


def default_reply(prompt: str) -> str:
    """The reply the fake gives when a test does not script one."""
    del prompt
    return SAMPLE_REPLY


class FakeProjector:
    """A vision projector's interface: an image is its markers around 4 image ids from its
    hash (its header checked as the real one checks it); `images` holds what it was given."""

    marker = "<__media__>"

    def __init__(self) -> None:
        self.images: list[bytes] = []

    def image_tokens(self, data: bytes) -> list[int]:
        image_size(data)
        self.images.append(data)
        return run_ids(hashlib.sha256(data).hexdigest(), 4)


class FakeEngine:
    """Scripted generation with the engine's interface."""

    architecture = "fake"
    add_bos = True
    bos_token = 0
    eos_token = 1

    def __init__(
        self,
        reply: Callable[[str], str] = default_reply,
        *,
        n_ctx: int = 4096,
        delay: float = 0.002,
        hold_after: int | None = None,
        template: str | None = None,
        projector: FakeProjector | None = None,
    ) -> None:
        self.reply = reply
        self.projector = projector  # reads images, as a model with a vision projector
        self.template = template  # a chat template of its own (else the built-in ChatML)
        self.last_prompt = ""  # the last reply's prompt, as text, and its options
        self.last_options: GenerationOptions | None = None
        self.n_ctx = n_ctx
        self.n_ctx_train = n_ctx
        self.delay = delay
        # After this many tokens of a reply, wait for `release` (or a cancel): lets a test act
        # while a reply is known to be mid-stream.
        self.hold_after = hold_after
        self.release = threading.Event()
        self.can_shift = True
        self.closed = False
        self._pieces: list[str] = list(SPECIALS)
        self._ids: dict[str, int] = {p: i for i, p in enumerate(self._pieces)}
        self._cached: list[int] = []
        self._lock = threading.Lock()

    # --- tokenizer ----------------------------------------------------------------------------

    def chat_template(self) -> str | None:
        return self.template or BUILTIN_TEMPLATES["chatml"]

    def _id(self, piece: str) -> int:
        with self._lock:
            if piece not in self._ids:
                self._ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            return self._ids[piece]

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        out = [self.bos_token] if add_special else []
        pos = 0
        specials = list(_SPECIAL_RE.finditer(text)) if parse_special else []
        for match in [*specials, None]:
            end = match.start() if match else len(text)
            out.extend(self._id(p) for p in _PIECE_RE.findall(text[pos:end]))
            if match:
                out.append(self._ids[match.group()])
                pos = match.end()
        return out

    def token_text(self, token: int) -> str:
        return "" if token < 0 else self._pieces[token]

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        if token < 0:  # an image's ids have no text
            return b""
        if token < len(SPECIALS) and not special:
            return b""
        return self._pieces[token].encode()

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special=special) for t in tokens).decode()

    # --- cache --------------------------------------------------------------------------------

    def evaluate(self, tokens: Sequence[int]) -> int:
        self._cached = list(tokens)
        return len(tokens)

    def shift_to(self, target: Sequence[int]) -> tuple[int, int]:
        old = self._cached
        same = 0
        while same < min(len(old), len(target)) and old[same] == target[same]:
            same += 1
        self._cached = list(target)
        return same, same + max(0, len(old) - len(target))

    def close(self) -> None:
        self.closed = True

    # --- generation ---------------------------------------------------------------------------

    def _script(self, prompt: Sequence[int]) -> list[int]:
        """Tokens still to generate: the scripted reply after what the prompt already holds."""
        text = self.detokenize(prompt, special=True)
        user = text.rsplit(_USER, 1)[-1].split("<|im_end|>", 1)[0] if _USER in text else text
        prefix = text.rsplit(_ASSISTANT, 1)[-1] if _ASSISTANT in text else ""
        full = self.reply(user)
        rest = full[len(prefix) :] if full.startswith(prefix) else ""
        return self.tokenize(rest, add_special=False)

    def _ends_before(
        self,
        token: int,
        generated: list[int],
        used: int,
        max_tokens: int,
        cancel: threading.Event | None,
        on_context_full: ContextFull | None,
    ) -> tuple[FinishReason, StopType] | int:
        """Why the reply ends before `token`, or the cells in use once there is room for it
        (after a context shift when the window is full)."""
        if cancel is not None and cancel.is_set():
            return "cancelled", "cancel"
        if max_tokens > 0 and len(generated) >= max_tokens:
            return "length", "limit"
        if used + 1 >= self.n_ctx:
            moved = on_context_full(generated + [token]) if on_context_full else None
            if moved is None:
                return "length", "context"
            used = len(moved)
        return used

    def _pause(self, n_generated: int, cancel: threading.Event | None) -> bool:
        """Hold at `hold_after` tokens until released, then wait the set pace; False when
        cancelled while held."""
        if self.hold_after is not None and n_generated == self.hold_after:
            while not self.release.wait(0.01):
                if cancel is not None and cancel.is_set():
                    break
            if cancel is not None and cancel.is_set():
                return False
        if self.delay:
            if cancel is not None:
                cancel.wait(self.delay)
            else:
                time.sleep(self.delay)
        return True

    def stream(
        self, prompt: Sequence[int], options: GenerationOptions
    ) -> Iterator[TokenEvent | Done]:
        max_tokens, cancel = options.max_tokens, options.cancel
        self.last_prompt = self.detokenize(prompt, special=True)
        self.last_options = options
        on_context_full = options.on_context_full
        started = time.monotonic()
        script = self._script(prompt)
        generated: list[int] = []
        used = len(prompt)
        first_at: float | None = None
        finish: FinishReason = "stop"
        stop_type: StopType = "eos"
        # A thinking template's reply split as the engine's token step splits it.
        thought = None if options.thinking is None else ThoughtStep(options.thinking)
        # A reply with tools: its calls parsed out by the engine's own parser.
        tools = None if options.tools is None else ToolStep(options.tools)
        for token in script:
            ended = self._ends_before(token, generated, used, max_tokens, cancel, on_context_full)
            if isinstance(ended, tuple):
                finish, stop_type = ended
                break
            used = ended
            if not self._pause(len(generated), cancel):
                finish, stop_type = "cancelled", "cancel"
                break
            generated.append(token)
            used += 1
            if first_at is None:
                first_at = time.monotonic()
            piece = self._pieces[token]
            parts: Any = None if thought is None else thought.take(piece, whole=True)
            calls: tuple[CallDelta, ...] = ()
            if tools is not None:
                parts, calls = tools.take(parts or (("content", piece),))
            yield TokenEvent(token, piece, None, parts, calls)
        tail: Any = () if thought is None else thought.finish("")
        if tools is not None:
            tail, calls = tools.take(tail, final=True)
            if tail or calls:
                yield TokenEvent(generated[-1] if generated else -1, "", None, tail, calls)
        elif tail:
            yield TokenEvent(generated[-1] if generated else -1, "", None, tail)
        end = time.monotonic()
        first = first_at or end
        if stop_type != "eos" and generated:
            # As the real engine: the last token was sampled but not yet decoded.
            self._cached = list(prompt) + generated[:-1]
        else:
            self._cached = list(prompt) + generated
        timings = Timings(
            prompt_n=len(prompt),
            prompt_ms=(first - started) * 1e3,
            predicted_n=len(generated),
            predicted_ms=(end - first) * 1e3,
            ttft_ms=(first - started) * 1e3,
        )
        split = None if thought is None else thought.split
        yield Done(
            text=self.detokenize(generated),
            finish_reason=finish,
            stop_type=stop_type,
            tokens=tuple(generated),
            timings=timings,
            prompt_tokens=len(prompt),
            reasoning=None if split is None else split.reasoning,
            content="" if split is None else split.content,
            reasoning_tokens=0 if thought is None else thought.n_reasoning,
            in_reasoning=split is not None and split.state == "reasoning",
            tool_calls=None if tools is None else tuple(tools.parser.calls),
        )


def fake_loader(
    engine: FakeEngine | None = None,
    *,
    name: str = "fake-model",
    steps: int = 5,
    step_delay: float = 0.0,
    fail: str | None = None,
) -> Callable[[ProgressCallback, threading.Event], ChatModel]:
    """A loader that 'loads' `engine` in `steps` reported steps, or fails with `fail`."""
    from localfab.chat.prompt import PromptBuilder

    def load(progress: ProgressCallback, cancel: threading.Event) -> ChatModel:
        eng = engine or FakeEngine()
        for i in range(steps):
            if cancel.wait(step_delay) if step_delay else cancel.is_set():
                raise LoadCancelled()
            progress(LoadProgress("loading weights", i / steps, f"step {i + 1} of {steps}"))
        if fail:
            raise ModelError(fail)
        info = ModelCard(
            name=name,
            path=f"/models/{name}.gguf",
            n_ctx=eng.n_ctx,
            gpu_layers=0,
            total_layers=18,
            plan=(f"context {eng.n_ctx}", "KV f16/f16", "CPU only"),
        )
        return ChatModel(eng, PromptBuilder(eng), info, eng.close)

    return load
