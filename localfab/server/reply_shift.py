"""How a reply that fills the context window goes on (`--context-shift`).

A chat request first gives up its oldest whole turns (ChatWindow). When none is left to give,
or for a plain completion, this is llama-server's shift: keep BOS + `n_keep` tokens and drop
half of what follows. Each shift works on what the cache holds at that moment, not on the whole
history: after the first shift the cache is shorter than prompt + reply, and halving the whole
history again would ask for a window that never fits (the reply then ended at about twice the
context). A reply shifts as many times as it needs, on one slot or on parallel slots, with or
without speculation (every path calls the engine's `_make_room` with the same invariant: the
cache holds everything but the reply's last token).
"""

from __future__ import annotations

from collections.abc import Sequence

from localfab.server.chat_window import ChatWindow


class ReplyShift:
    """The engine's `on_context_full` callback for one reply; it remembers what the cache holds
    after each shift it asked for."""

    def __init__(
        self,
        prompt: Sequence[int],
        n_keep: int,
        window: ChatWindow | None,
        shifted: list[bool] | None = None,
    ) -> None:
        self._shifted = shifted if shifted is not None else [False]  # set at the first shift
        self._n_keep = n_keep
        self._n_prompt = len(prompt)
        self._window = window
        # The cache after the last shift (the prompt before any), and how many tokens the reply
        # had then: the cache now is `_base` + generated[_at - 1 : -1].
        self._base = list(prompt)
        self._at = 1
        self._halved = False  # once halved, the window's turns no longer describe the cache

    def __call__(self, generated: list[int]) -> list[int] | None:
        """The tokens the cache should hold instead; None: the reply stops here."""
        if self._window is not None and not self._halved:
            target = self._window.on_context_full(generated)
            if target is not None:
                return self._took(target, generated)
        cached = self._base + generated[self._at - 1 : -1]
        keep = 1 + (self._n_keep if self._n_keep >= 0 else self._n_prompt)
        keep = min(keep, len(cached) - 2)
        n_discard = (len(cached) - keep) // 2
        if keep < 1 or n_discard <= 0:
            return None
        self._halved = True
        return self._took(cached[:keep] + cached[keep + n_discard :], generated)

    def _took(self, target: list[int], generated: list[int]) -> list[int]:
        self._base, self._at = list(target), len(generated)
        self._shifted[0] = True
        return target
