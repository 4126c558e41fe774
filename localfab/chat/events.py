"""What a chat turn streams besides tokens: shifts, continuations and the finished reply."""

from __future__ import annotations

from dataclasses import dataclass, field

from localfab.chat.toolturns import ToolCallMade
from localfab.engine import Done, Timings, TokenEvent


@dataclass(frozen=True)
class Shifted:
    """Whole oldest turns left the window."""

    turns: int
    tokens: int
    reprocessed: bool  # True when the model's cache cannot shift and the rest was re-processed
    during_reply: bool

    def describe(self) -> str:
        how = "re-processed the rest" if self.reprocessed else "kept the rest without re-processing"
        return (
            f"context full: {self.turns} oldest turn(s) ({self.tokens} tokens) left the window; "
            f"{how}"
        )


@dataclass(frozen=True)
class Continued:
    """The reply hit the token limit and is being continued (count: this continuation's number)."""

    count: int
    limit: int


@dataclass(frozen=True)
class Reply:
    """The finished reply of one turn."""

    text: str
    finish_reason: str
    stop_type: str
    continues: int
    shifts: tuple[Shifted, ...]
    timings: Timings  # of the first piece: its TTFT is the turn's TTFT
    pieces: tuple[Done, ...] = field(default_factory=tuple)
    # A thinking model's thought (not in `text`) and the tokens it took, its tags included.
    reasoning: str = ""
    reasoning_tokens: int = 0
    tool_calls: tuple[ToolCallMade, ...] = ()  # the calls it made (with tools)

    @property
    def completion_tokens(self) -> int:
        """Sampled tokens over all pieces, counted as llama-server counts them."""
        return sum(p.completion_tokens for p in self.pieces)


ChatEvent = TokenEvent | Shifted | Continued | Reply

# A reply's stored status by how its last piece finished.
FINISH_STATUS = {"cancelled": "interrupted", "length": "length"}
