"""One response dialect per shape: native `/completion`, OpenAI `/v1/completions` and
`/v1/chat/completions`.

A dialect turns what the engine thread emits for one result (progress, tokens, the end) into
that shape's chunks, builds the whole answer of a non-streamed result, and merges the results
of a request with several prompts (or `n` > 1) as llama-server does: native answers are a JSON
array, OpenAI answers one object whose `choices` hold every result in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localfab.chat.toolturns import new_call_id
from localfab.engine.reasoning import Thinking, Unsplit
from localfab.engine.types import Done, TokenEvent, TokenProbs
from localfab.server import shapes
from localfab.server.jobs import Progress, Step
from localfab.server.params import Generation

Probs = Sequence[tuple[int, TokenProbs]]

Detokenize = Callable[[Sequence[int]], str]


def nested_values(paths: Sequence[str], data: dict[str, Any]) -> dict[str, Any]:
    """llama-server's json_get_nested_values: `response_fields`, a slash descends a level and
    the value is returned under the whole path; missing paths are left out."""
    out: dict[str, Any] = {}
    for path in paths:
        current: Any = data
        for key in path.split("/"):
            if not isinstance(current, dict) or key not in current:
                break
            current = current[key]
        else:
            out[path] = current
    return out


@dataclass(frozen=True)
class Reasoning:
    """A thinking template's tags (None: the model does not think) and the request's
    `reasoning_format`, as llama-server of this llama.cpp answers them: "none" leaves the block
    in `content`; "auto", "deepseek" and "deepseek-legacy" put it in `reasoning_content`,
    streamed as `delta.reasoning_content` (legacy's inline streaming is gone from it too)."""

    thinking: Thinking | None = None
    fmt: str = "auto"

    def splits(self) -> bool:
        return self.thinking is not None and self.fmt != "none"


class Dialect:
    """The native `/completion` shape; the OpenAI dialects override what differs."""

    done_event = b""  # sent after the last chunk of a stream
    oai = False

    def __init__(self, gen: Generation, detokenize: Detokenize, *, verbose: bool) -> None:
        self.gen = gen
        self.detokenize = detokenize
        self.verbose = verbose

    # --- streams ---------------------------------------------------------------------------

    def start(self, reply: shapes.ResultMeta) -> list[dict[str, Any]]:
        """Chunks at the start of one result's stream."""
        return []

    def progress(self, reply: shapes.ResultMeta, progress: Progress) -> list[dict[str, Any]]:
        res = shapes.native_partial(reply, "", -1, 0)
        res["prompt_progress"] = progress.to_dict()
        if self.gen.timings_per_token:
            res["timings"] = progress.timings()
        return [res]

    def token(self, reply: shapes.ResultMeta, step: Step, n_decoded: int) -> list[dict[str, Any]]:
        event = step.event
        res = shapes.native_partial(reply, event.text, event.token, n_decoded, event.probs)
        if step.timings is not None:
            res["timings"] = step.timings.to_dict()
        return [res]

    def stream_end(
        self, reply: shapes.ResultMeta, done: Done, tokens: Sequence[int]
    ) -> list[dict[str, Any]]:
        return [self.native(reply, done, tokens, stream=True)]

    # --- whole answers -----------------------------------------------------------------------

    def native(
        self,
        reply: shapes.ResultMeta,
        done: Done,
        tokens: Sequence[int],
        *,
        stream: bool = False,
        probs: Probs = (),
    ) -> dict[str, Any]:
        res = shapes.native_final(
            reply,
            done,
            stream=stream,
            prompt_text=self.detokenize(tokens),
            settings=self.gen.settings_json,
            return_tokens=self.gen.return_tokens,
            probs=probs,
        )
        if self.gen.response_fields:
            return nested_values(self.gen.response_fields, res)
        return res

    def final(
        self, reply: shapes.ResultMeta, done: Done, tokens: Sequence[int], probs: Probs
    ) -> dict[str, Any]:
        return self.native(reply, done, tokens, probs=probs)

    def merge(self, results: list[dict[str, Any]]) -> Any:
        """One result as itself; several as an array (native) or as choices (OpenAI)."""
        if len(results) == 1:
            return results[0]
        if not self.oai:
            return results
        merged = dict(results[0])
        merged["choices"] = [c for r in results for c in r["choices"]]
        return merged

    def _verbose(self, res: dict[str, Any], native: Callable[[], dict[str, Any]]) -> None:
        if self.verbose:
            res["__verbose"] = native()


class Completions(Dialect):
    """OpenAI `/v1/completions` (`text_completion`)."""

    done_event = shapes.DONE_EVENT
    oai = True

    def progress(self, reply: shapes.ResultMeta, progress: Progress) -> list[dict[str, Any]]:
        res = shapes.cmpl_partial(reply, "")
        res["prompt_progress"] = progress.to_dict()
        if self.gen.timings_per_token:
            res["timings"] = progress.timings()
        return [res]

    def token(self, reply: shapes.ResultMeta, step: Step, n_decoded: int) -> list[dict[str, Any]]:
        event = step.event
        probs = [(event.token, event.probs)] if event.probs is not None else []
        res = shapes.cmpl_partial(reply, event.text, probs)
        self._verbose(res, lambda: super(Completions, self).token(reply, step, n_decoded)[0])
        if step.timings is not None:
            res["timings"] = step.timings.to_dict()
        return [res]

    def stream_end(
        self, reply: shapes.ResultMeta, done: Done, tokens: Sequence[int]
    ) -> list[dict[str, Any]]:
        res = shapes.cmpl_final(reply, done, stream=True)
        self._verbose(res, lambda: self.native(reply, done, tokens, stream=True))
        return [res]

    def final(
        self, reply: shapes.ResultMeta, done: Done, tokens: Sequence[int], probs: Probs
    ) -> dict[str, Any]:
        res = shapes.cmpl_final(reply, done, stream=False, probs=probs)
        self._verbose(res, lambda: self.native(reply, done, tokens, probs=probs))
        return res


class Chat(Dialect):
    """OpenAI `/v1/chat/completions` (`chat.completion[.chunk]`)."""

    done_event = shapes.DONE_EVENT
    oai = True

    def __init__(
        self,
        gen: Generation,
        detokenize: Detokenize,
        *,
        verbose: bool,
        reasoning: Reasoning | None = None,
    ) -> None:
        super().__init__(gen, detokenize, verbose=verbose)
        # Per result: the probabilities of tokens whose text is still held back.
        self._held: dict[int, list[tuple[int, TokenProbs]]] = {}
        self.reasoning = reasoning or Reasoning()
        # Per result, while streaming with reasoning_format none: the text as llama-server
        # leaves it (the engine splits the others: TokenEvent.parts).
        self._unsplit: dict[int, Unsplit] = {}
        # Per result: the ids of its tool calls (the model's, or made here), in call order.
        self._call_ids: dict[int, list[str]] = {}

    def _call_id(self, result: int, call: int, given: str = "") -> str:
        ids = self._call_ids.setdefault(result, [])
        while len(ids) <= call:
            chars = self.gen.tools.syntax.id_chars if self.gen.tools else 0
            ids.append(given if len(ids) == call and given else new_call_id(chars))
        return ids[call]

    def _tool_deltas(self, index: int, event: TokenEvent) -> list[dict[str, Any]]:
        """With tools: the split's pieces, then what the token added to the calls."""
        splits = self.reasoning.splits()
        out = []
        for kind, piece in event.parts or ():
            key = "reasoning_content" if kind == "reasoning" and splits else "content"
            out.append({key: piece})
        for call in event.calls:
            # A call's name comes once, with its first piece: so does its id.
            call_id = self._call_id(index, call.index, call.id) if call.name else ""
            if call.name or call.arguments:
                out.append(shapes.tool_call_delta(call.index, call.name, call.arguments, call_id))
        return out

    def _deltas(self, index: int, event: TokenEvent) -> list[dict[str, Any]]:
        """The stream's deltas for one event of one result (the split's pieces, or the text)."""
        reasoning = self.reasoning
        if self.gen.tools is not None:
            return self._tool_deltas(index, event)
        if reasoning.splits():
            return [
                {"reasoning_content" if kind == "reasoning" else "content": piece}
                for kind, piece in event.parts or ()
            ]
        text = event.text
        thinking = reasoning.thinking
        if thinking is not None and text:
            text = self._unsplit.setdefault(index, Unsplit(thinking)).feed(text)
        return [{"content": text}] if text else []

    def start(self, reply: shapes.ResultMeta) -> list[dict[str, Any]]:
        # The role chunk opens every chat stream; with progress it comes with each progress.
        return [] if self.gen.return_progress else [shapes.chat_role_chunk(reply)]

    def progress(self, reply: shapes.ResultMeta, progress: Progress) -> list[dict[str, Any]]:
        res = shapes.chat_role_chunk(reply)
        res["prompt_progress"] = progress.to_dict()
        if self.gen.timings_per_token:
            res["timings"] = progress.timings()
        return [res]

    def token(self, reply: shapes.ResultMeta, step: Step, n_decoded: int) -> list[dict[str, Any]]:
        event = step.event
        out = []
        if n_decoded == 1 and self.gen.return_progress:
            out.append(shapes.chat_role_chunk(reply))
        held = self._held.setdefault(reply.index, [])
        if event.probs is not None:
            held.append((event.token, event.probs))
        deltas = self._deltas(reply.index, event)
        for i, delta in enumerate(deltas):
            last = i == len(deltas) - 1
            out.append(shapes.chat_chunk(reply, delta, None, held if last else ()))
        if deltas:
            self._held[reply.index] = []
        if out and step.timings is not None:
            out[-1]["timings"] = step.timings.to_dict()
        return out

    def stream_end(
        self, reply: shapes.ResultMeta, done: Done, tokens: Sequence[int]
    ) -> list[dict[str, Any]]:
        chunks = shapes.chat_final_chunks(reply, done, include_usage=self.gen.include_usage)
        self._verbose(chunks[0], lambda: self.native(reply, done, tokens, stream=True))
        return chunks

    def final(
        self, reply: shapes.ResultMeta, done: Done, tokens: Sequence[int], probs: Probs
    ) -> dict[str, Any]:
        thinking = self.reasoning.thinking
        if done.tool_calls is not None:
            calls = [
                shapes.tool_call_json(c.name, c.arguments, self._call_id(reply.index, i, c.id))
                for i, c in enumerate(done.tool_calls)
            ]
            reasoning = done.reasoning if self.reasoning.splits() else None
            res = shapes.chat_final(
                reply,
                done,
                probs,
                content=done.content,
                reasoning=reasoning or "",
                tool_calls=calls,
            )
        elif done.reasoning is not None and self.reasoning.splits():
            res = shapes.chat_final(
                reply, done, probs, content=done.content, reasoning=done.reasoning
            )
        elif thinking is not None:
            res = shapes.chat_final(reply, done, probs, content=Unsplit(thinking).feed(done.text))
        else:
            res = shapes.chat_final(reply, done, probs)
        self._verbose(res, lambda: self.native(reply, done, tokens, probs=probs))
        return res
