"""Tool calls put back together from streamed deltas, as a client does (for the tests)."""

from __future__ import annotations

from dataclasses import dataclass, field

from localfab.engine.callsyntax import Call, CallDelta


@dataclass
class Assembled:
    """Calls put back together from streamed deltas, as a client does."""

    calls: list[Call] = field(default_factory=list)

    def add(self, delta: CallDelta) -> None:
        while len(self.calls) <= delta.index:
            self.calls.append(Call(""))
        call = self.calls[delta.index]
        call.name += delta.name
        call.id = delta.id or call.id
        call.arguments += delta.arguments
