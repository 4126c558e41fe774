"""What the handlers share: settings, the engine worker, the model's facts (`Server`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from localfab.server.checks import check_bias, check_prompt
from localfab.server.jobs import SlotView
from localfab.server.keys import KeyCheck
from localfab.server.model_info import ModelInfo
from localfab.server.params import Generation
from localfab.server.plumbing import read_json
from localfab.server.settings import ServerSettings
from localfab.server.streams import Sessions

if TYPE_CHECKING:
    from localfab.runtime import LoadedModel
    from localfab.server.worker import EngineWorker

# Prompts this long are tokenized in a thread so the event loop keeps answering.
_TOKENIZE_INLINE_MAX = 32 * 1024


class Server:
    """State shared by the handlers: settings, the engine worker and the model's facts."""

    def __init__(self, worker: EngineWorker, settings: ServerSettings) -> None:
        self.worker = worker
        self.settings = settings
        self.info: ModelInfo | None = None
        self.key_ok = KeyCheck(settings.api_keys)
        # What /props shows, kept from the load so a sleeping server answers it.
        self.caps: dict[str, Any] = {}
        self.n_ctx_slot = 0
        self.speculative = False
        self.streams = Sessions()  # resumable streams (X-Conversation-Id)
        self._prompts: dict[int, tuple[tuple[int, ...], str]] = {}  # slot: its prompt's text

    def remember(self, model: LoadedModel) -> None:
        """Keep what the read-only endpoints show of the model (they answer while it sleeps)."""
        from localfab.chat.thinking import template_caps
        from localfab.chat.tools import tool_caps

        template = model.prompts.template
        self.caps = {**template_caps(template), **tool_caps(template)}
        self.n_ctx_slot = model.engine.n_ctx
        self.speculative = model.engine.speculation is not None

    async def wake(self) -> None:
        """Load the model again (the server sleeps: --sleep-idle-seconds); returns once it
        is in. The call waits in the worker's queue until the model was freed and loaded."""
        await asyncio.wrap_future(self.worker.call(lambda model: None))

    @property
    def model(self) -> LoadedModel:
        assert self.worker.model is not None
        return self.worker.model

    @property
    def slot_n_ctx(self) -> int:
        """The context each slot has: -c split over the slots (unless --kv-unified)."""
        return self.n_ctx_slot or self.model.engine.n_ctx

    @property
    def n_processing(self) -> int:
        return self.worker.n_processing

    async def read_json(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object, within the size and time limits (see `plumbing`)."""
        return await read_json(request, self.settings)

    def verbose(self, gen: Generation) -> bool:
        """Whether answers carry `__verbose` (--verbose, or the request's `verbose`)."""
        return self.settings.verbose if gen.verbose is None else gen.verbose

    def prompt_text(self, tokens: Sequence[int]) -> str:
        return self.model.engine.detokenize(tokens, special=True)

    async def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        engine = self.model.engine
        if len(text) <= _TOKENIZE_INLINE_MAX:
            return engine.tokenize(text, add_special=add_special, parse_special=parse_special)
        return await asyncio.to_thread(
            engine.tokenize, text, add_special=add_special, parse_special=parse_special
        )

    def check_prompt(self, tokens: list[int]) -> None:
        engine = self.model.engine
        check_prompt(tokens, engine.n_vocab, engine.n_ctx, images=engine.projector is not None)

    def check_bias(self, gen: Generation) -> None:
        check_bias(gen.sampling, self.model.engine.n_vocab)

    def _slot_prompt(self, i: int, tokens: Sequence[int]) -> str:
        """A slot's prompt as text; while the model sleeps, the text it had when last shown
        (or when the model went to sleep)."""
        key = tuple(tokens)
        kept = self._prompts.get(i)
        if kept is not None and kept[0] == key:
            return kept[1]
        with self.worker.sleep_lock:  # the worker frees the model only after it says so
            model = self.worker.model
            if self.worker.sleeping or model is None:
                return ""
            text = model.engine.detokenize(list(tokens), special=True)
        self._prompts[i] = (key, text)
        return text

    def slot_json(self, i: int) -> dict[str, Any]:
        """/slots' entry for slot `i`: its current (or last) task, as llama-server shows it."""
        slot = self.worker.slots[i] if i < len(self.worker.slots) else SlotView()
        data: dict[str, Any] = {
            "id": i,
            "n_ctx": self.slot_n_ctx,
            "speculative": self.speculative,
            "is_processing": slot.processing,
        }
        cache = self.worker.prompt_cache
        if cache.enabled:  # shared by the slots: the same in each entry
            st = cache.stats
            data["prompt_cache"] = {
                "hits": st.hits,
                "tokens_restored": st.tokens_restored,
                "disk_hits": st.disk_hits,
                "prompts": len(cache.entries),
                "bytes": cache.nbytes,
            }
        if slot.id_task < 0:
            return data
        # As llama-server: a released slot's counters are reset (its last task's rest stays).
        n_decoded = slot.n_decoded if slot.processing else 0
        limited = slot.processing and slot.n_predict >= 0
        n_remain = max(slot.n_predict - n_decoded, 0) if limited else -1
        data.update(
            {
                "id_task": slot.id_task,
                "n_prompt_tokens": slot.n_prompt_tokens,
                "n_prompt_tokens_processed": slot.n_prompt_tokens_processed,
                "n_prompt_tokens_cache": slot.n_prompt_tokens_cache,
                "n_prompt_tokens_restored": slot.n_prompt_tokens_restored,
                "params": slot.params,
                "next_token": [
                    {
                        "has_next_token": slot.processing,
                        "has_new_line": slot.has_new_line,
                        "n_remain": n_remain,
                        "n_decoded": n_decoded,
                    }
                ],
            }
        )
        if self.settings.slots_debug:
            data["prompt"] = self._slot_prompt(i, slot.prompt)
            data["generated"] = slot.generated
        return data
