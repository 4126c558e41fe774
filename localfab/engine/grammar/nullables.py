"""Runs of nullable grammar elements, counted in `check_grammar`'s single pass.

Nullable elements (`x?`, `x*`, `x{m,n}` with m < n) that one position reaches without consuming
a character each multiply the ways llama.cpp's sampler can split a token's text; `Nullables`
follows those runs through groups, alternatives, repetitions and rule references and refuses a
grammar past `GRAMMAR_MAX_NULLABLE_RUN` or `GRAMMAR_MAX_NULLABLE`.
"""

from __future__ import annotations

from localfab.engine.grammar.bounds import GRAMMAR_MAX_NULLABLE, GRAMMAR_MAX_NULLABLE_RUN, too

# An element's reach: (lead, trail, through, total). `lead`: nullable elements reachable from its
# start without consuming a character; `trail`: those reachable backwards from its end; `through`:
# those passed when it matches nothing (-1: it cannot); `total`: nullable elements in it,
# repetitions multiplied.
Reach = tuple[int, int, int, int]
FIXED: Reach = (0, 0, -1, 0)
UNKNOWN: tuple[Reach, int] = (FIXED, 3)  # a rule not defined yet
BIG = 10**9


class Nullables:
    """Runs of nullable elements, computed alongside check_grammar's single pass."""

    def __init__(self, known: dict[str, tuple[Reach, int]]) -> None:
        self.known = known  # rules seen in an earlier pass: a reference reaches what they do
        self.rules: dict[str, tuple[Reach, int]] = {}  # reach and weight of each rule
        self.forward: set[str] = set()  # rules referred to before their definition
        self.added = False  # the last reference added its name to `forward`
        self.total = 0
        self.name = ""
        self.top_alts: list[Reach] = []  # finished alternatives of the rule itself
        self.top_w = 1
        self.w = 1  # weight of the pending element's own optional branch
        self._start_rule()

    def _start_rule(self) -> None:
        self.frames: list[list[Reach]] = []  # finished alternatives of each open group
        self.seqs: list[list[int]] = [[0, 0, 0, 0]]  # lead, run, through, total of each sequence
        # Weight of what can come first in each open sequence / finished group alternatives.
        self.seq_w: list[int] = [1]
        self.frame_w: list[int] = []
        self.pending: Reach | None = None
        self.pending_name = ""

    @staticmethod
    def check(run: int) -> None:
        if run > GRAMMAR_MAX_NULLABLE_RUN:
            raise too(
                "grammar run of optional elements",
                f"{min(run, BIG)} (`?`, `*`, `+`, `{{m,n}}` in a row; one that may start with "
                "almost any character counts 3)",
                GRAMMAR_MAX_NULLABLE_RUN,
                "make fewer elements in a row optional, or nest them: `(x (x)?)?`",
            )

    def _add(self, seq: list[int], a: Reach) -> None:
        lead, run, through, total = seq
        al, at, ath, atot = a
        self.check(run + al)
        if through >= 0:
            lead = max(lead, through + al)
        if ath >= 0:
            run = min(max(run + ath, at), BIG)
            through = through + ath if through >= 0 else -1
        else:
            run, through = at, -1
        self.check(run)
        seq[:] = [lead, run, through, min(total + atot, BIG)]

    @staticmethod
    def _end(seq: list[int]) -> Reach:
        lead, run, through, total = seq
        return (max(lead, through), run, through, total)

    def _flush(self) -> None:
        if self.pending is not None:
            if self.seqs[-1][2] >= 0:  # all before it may match nothing: it can come first
                self.seq_w[-1] = max(self.seq_w[-1], self.w)
            self._add(self.seqs[-1], self.pending)
            self.pending = None

    def atom(self, name: str = "", wide: bool = False) -> None:
        self._flush()
        # An optional part that can start with almost any character (a negated class, `.`, a
        # rule not seen yet) splits every token of the vocabulary many ways: it counts 3 times.
        self.added = bool(name) and name not in self.rules and name not in self.forward
        if self.added:
            self.forward.add(name)
        if name:  # a rule defined above, else one known from the first pass
            reach, self.w = self.rules.get(name) or self.known.get(name, UNKNOWN)
        else:
            reach, self.w = FIXED, 1
        if wide:
            self.w = 3
        self.pending = (*reach[:3], 0)  # the rule's own elements are counted where it is defined
        self.pending_name = name

    def op(self, op: str) -> None:
        a = self.pending
        if a is None:
            return  # llama.cpp reports the stray operator
        al, at, ath, atot = a
        if op in "*+":
            # `x+` is `x x*`: it must match something, but how much is open, and the split of a
            # token's text between it and its neighbours is as open as with `x*`.
            self.pending = self._star(a)
        else:
            w = self.w
            self.pending = (al + w, max(at, w), max(ath, 0) + w, min(atot + 1, BIG))
        self._count(self.pending[3] - atot)

    def _star(self, a: Reach) -> Reach:
        al, at, ath, atot = a
        w = self.w
        self.check(at + al + w)  # one repetition's end meets the next one's start
        return (al + w, at + w, max(ath, 0) + w, min(atot + 1, BIG))

    def rep(self, lo: int, hi: int | None) -> None:
        a = self.pending
        if a is None:
            return
        al, at, ath, atot = a
        opt = 1 if hi is None or lo < hi else 0
        w = self.w * opt
        n = max(lo, hi or lo + 1)
        if ath >= 0:  # every copy of a part that may match nothing adds to the run
            reach = min(n * max(ath, al, at, 1) + w, BIG)
            new = (reach, reach, min(n * ath + w, BIG), min(n * atot + opt, BIG))
        else:
            if n > 1:
                self.check(at + al + w)
            if lo == 0:
                new = (al + w, at + w, w, min(n * atot + opt, BIG))
            else:
                new = (al, at + w, -1, min(n * atot + opt, BIG))
        self.pending = new
        self._count(new[3] - atot)

    def _count(self, added: int) -> None:
        self.total = min(self.total + max(added, 0), BIG)
        if self.total > GRAMMAR_MAX_NULLABLE:
            raise too(
                "grammar optional element count",
                self.total,
                GRAMMAR_MAX_NULLABLE,
                "use fewer `?`, `*`, `+` and `{m,n}`, or smaller repetition counts",
            )

    def open(self) -> None:
        self._flush()
        self.frames.append([])
        self.frame_w.append(1)
        self.seqs.append([0, 0, 0, 0])
        self.seq_w.append(1)

    def bar(self) -> None:
        self._flush()
        if self.frames:
            self.frames[-1].append(self._end(self.seqs.pop()))
            self.frame_w[-1] = max(self.frame_w[-1], self.seq_w.pop())
        else:
            self.top_alts.append(self._end(self.seqs.pop()))
            self.top_w = max(self.top_w, self.seq_w.pop())
        self.seqs.append([0, 0, 0, 0])
        self.seq_w.append(1)

    def close(self) -> None:
        self._flush()
        if not self.frames:
            return  # a stray `)`: llama.cpp reports it
        alts = self.frames.pop()
        alts.append(self._end(self.seqs.pop()))
        self.pending = self._join(alts)
        self.w = max(self.frame_w.pop(), self.seq_w.pop())

    @staticmethod
    def _join(alts: list[Reach]) -> Reach:
        lead = max(a[0] for a in alts)
        trail = max(a[1] for a in alts)
        throughs = [a[2] for a in alts if a[2] >= 0]
        total = min(sum(a[3] for a in alts), BIG)
        if not throughs:
            return (lead, trail, -1, total)
        # An empty alternative beside others is one more way to match nothing, like `?`.
        extra = 1 if len(alts) > 1 else 0
        return (lead + extra, max(trail, extra), max(throughs) + extra, total)

    def rule(self, name: str) -> None:
        """`name ::=` begins a rule; the reference to `name` just seen is its name, not an atom."""
        if self.added:  # the name was taken for a reference
            self.forward.discard(name)
        self.pending = None
        self.end_rule()
        self.name = name

    def end_rule(self) -> None:
        self._flush()
        while self.frames:  # unclosed groups: llama.cpp reports them
            self.close()
            self._flush()
        alts = [*self.top_alts, self._end(self.seqs.pop())]
        if self.name:
            self.rules[self.name] = (self._join(alts), max(self.top_w, self.seq_w.pop()))
        self.top_alts = []
        self.top_w = 1
        self._start_rule()
