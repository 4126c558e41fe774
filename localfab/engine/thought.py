"""A thinking model's reply inside the token step: its text split into reasoning and answer as
it comes, and the reasoning budget.

`ThoughtStep` rides in a reply's `ReplyState` when the request names the template's thinking
(`GenerationOptions.thinking`), so the split works alike on one sequence, on the server's
parallel slots and under speculative decoding. The budget follows llama-server's
`--reasoning-budget N` (its `common/reasoning-budget.cpp`): once a block holds N tokens after
its opening tag (the prompt's own tokens after a tag it opened count too) and the text ends on a
whole character, the next tokens are forced, not sampled: the budget message, if any, then the
closing tag; the answer follows. A block opened again later gets a budget of its own. 0 closes
the block as soon as it opens; -1 is no budget. The budget finds the tags in the text, where
llama-server matches their tokens: a tokenizer that spells a tag with other tokens inside the
prompt (Gemma's merges the `><` of `<｜Assistant｜><think>`) still gets its budget.
"""

from __future__ import annotations

from localfab.engine.reasoning import Kind, ReasoningSplit, Thinking, merged

Parts = tuple[tuple[Kind, str], ...]


class ThoughtStep:
    """The split and the budget of one reply (see the module's docstring)."""

    def __init__(
        self,
        thinking: Thinking,
        budget: int = -1,
        forced: list[int] | None = None,
        *,
        n_tail: int = 0,
    ) -> None:
        """`forced`: the budget message's and the closing tag's tokens; `n_tail`: the prompt's
        tokens after the opening tag, where the prompt opened the block."""
        self.split = ReasoningSplit(thinking)
        self.start, self.end = thinking.start, thinking.end
        self.budget = budget if forced else -1
        self.forced_tokens = list(forced or ())
        self._queue: list[int] = []  # the forced tokens still to come, last first
        self._forcing = 0  # forced tokens not yet taken
        self.open = thinking.opened_by_prompt  # inside a block, as the budget sees it
        self.n_block = n_tail if self.open else 0  # tokens in the open block after its tag
        self._seen = ""  # text since the last tag the budget found, its tail only
        self.n_reasoning = 0  # tokens that were (part of) the reasoning, the tags included
        self.budget_hit = False  # the budget closed a block
        if self.open and 0 <= self.budget <= self.n_block:
            self._fire()

    def forced(self) -> int | None:
        """The token the budget forces next, if it forces one."""
        queue = self._queue
        return queue.pop() if queue else None

    def take(self, text: str, *, whole: bool) -> Parts:
        """A token's text (after the stop strings): the new pieces of reasoning and answer.
        `whole`: the text so far ends on a whole UTF-8 character (the budget waits for one)."""
        split = self.split
        was = split.state == "reasoning"
        parts = tuple(split.feed(text)) if text else ()
        if was or split.state == "reasoning":
            self.n_reasoning += 1
        if self.budget >= 0:
            self._count(text, whole)
        return parts

    def _count(self, text: str, whole: bool) -> None:
        """The budget's view of one token: a tag it completes, or one more token of a block."""
        if self._forcing:
            self._forcing -= 1
            seen = self._seen + text
            if self.end in seen:
                self.open, self._seen = False, seen[seen.index(self.end) + len(self.end) :]
            else:
                self._seen = seen[-len(self.end) :]
            return
        seen = self._seen + text
        tag = self.end if self.open else self.start
        at = seen.find(tag)
        if at >= 0:  # the tag ends this token's text: that token is not counted
            self.open, self.n_block = not self.open, 0
            self._seen = seen[at + len(tag) :]
            if self.open and self.budget == 0 and whole:
                self._fire()
            return
        self._seen = seen[-len(tag) :]
        if self.open:
            self.n_block += 1
            if self.n_block >= self.budget and whole:
                self._fire()

    def _fire(self) -> None:
        self.budget_hit = True
        self._queue = self.forced_tokens[::-1]
        self._forcing = len(self.forced_tokens)
        self._seen = ""

    def finish(self, tail: str) -> Parts:
        """The end of the reply: the last text, and what the split held back."""
        split = self.split
        parts = split.feed(tail) if tail else []
        return tuple(merged(parts + split.finish()))
