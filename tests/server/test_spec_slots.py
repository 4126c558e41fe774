"""Speculative decoding on parallel slots (`BatchDecoder`): each reply drafts from its own
history and verifies in the shared step.

A reply alone on a slot verifies no more tokens than llama.cpp computes exactly as one token
(`Engine.speculation_batch`), so at temperature 0 it is the plain reply token for token, whatever
ends it; replies decoded beside others follow their alone text up to llama.cpp's near-ties (see
`tests/greedy.py`, and the server test). No slot's cache ever keeps a rejected drafted cell.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localfab.engine import Done, GenerationOptions, SamplingParams, TokenEvent
from localfab.engine.types import SpecSettings
from tests.engine.test_spec import GREEDY, REWRITE, TEXT, same

pytestmark = pytest.mark.model

NGRAM = SpecSettings(spec_type="ngram-simple", adaptive=False)
N_SLOTS = 3


@pytest.fixture(scope="module")
def eng(model_path: Path) -> Iterator[Any]:
    from localfab.engine import Engine, EngineSettings

    # 768 cells per slot; batch-invariant kernels and a q8_0 cache keep long verifies exact.
    settings = EngineSettings(
        n_ctx=768 * N_SLOTS,
        n_batch=512,
        n_seq_max=N_SLOTS,
        batch_invariant=True,
        type_k="q8_0",
        type_v="q8_0",
    )
    engine = Engine(model_path, settings)
    yield engine
    engine.close()


def assert_no_rejected_cells(decoder: Any) -> None:
    """Every slot's sequence holds exactly the cells its mirror lists, no drafted extras."""
    for slot in decoder.slots:
        assert slot.kv.pos_max() + 1 == len(slot.kv.cached), f"slot {slot.id}"


def run_slots(
    engine: Any,
    spec: SpecSettings | None,
    replies: list[tuple[int, list[int], GenerationOptions]],
    on_token: Any = None,
    draft: Any = None,
) -> dict[int, Done]:
    """Run (slot id, prompt, options) replies together to their ends; each slot's Done. The
    caches are checked after every step. A `draft` model stays open (the caller closes it)."""
    from localfab.engine.batch import BatchDecoder

    engine.set_speculation(spec, draft)
    decoder = BatchDecoder(engine)
    try:
        for slot_id, prompt, opts in replies:
            decoder.slots[slot_id].kv.clear()
            decoder.start(decoder.slots[slot_id], prompt, opts)
        done: dict[int, Done] = {}
        while decoder.busy:
            for res in decoder.step():
                assert res.error is None, res.error
                for event in res.events:
                    if isinstance(event, Done):
                        done[res.slot.id] = event
                    elif on_token is not None:
                        on_token(res.slot.id, event)
            assert_no_rejected_cells(decoder)
        return done
    finally:
        decoder.close()
        engine.set_speculation(None, draft)


def alone(engine: Any, prompt: list[int], slot: int = 1, **kw: Any) -> tuple[Done, Done]:
    """The reply on one slot without speculation, and with it."""
    opts = GenerationOptions(**kw)
    plain = run_slots(engine, None, [(slot, prompt, opts)])[slot]
    fast = run_slots(engine, NGRAM, [(slot, prompt, GenerationOptions(**kw))])[slot]
    return plain, fast


def test_a_rewrite_alone_on_a_slot_is_token_identical_and_mostly_drafted(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    plain, fast = alone(eng, prompt, max_tokens=110, sampling=GREEDY)
    same(plain, fast)
    t = fast.timings
    assert t.draft_n > 50 and t.draft_n_accepted > 0.8 * t.draft_n
    assert t.draft_verifies > 0 and plain.timings.draft_n == 0
    assert t.to_dict()["draft_n"] == t.draft_n


def test_stop_strings_max_tokens_and_grammar_inside_drafted_runs(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    for stop in ("spiral stairs", "dangerous reef"):
        plain, fast = alone(eng, prompt, max_tokens=110, sampling=GREEDY, stop=[stop])
        same(plain, fast)
        assert fast.stopping_word == stop and fast.timings.draft_n_accepted > 0
    for n in (1, 2, 37):
        plain, fast = alone(eng, prompt, max_tokens=n, sampling=GREEDY)
        same(plain, fast)
        assert len(fast.tokens) == n
    grammar = SamplingParams(temperature=0, grammar='root ::= [A-Za-z ,.\\n:]+ "."')
    plain, fast = alone(eng, prompt, max_tokens=80, sampling=grammar)
    same(plain, fast)
    assert fast.timings.draft_n_accepted > 10


def test_a_cancel_inside_a_drafted_run_keeps_the_tokens_of_that_step(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    cancel = threading.Event()
    seen: list[int] = []

    def on_token(slot: int, event: TokenEvent) -> None:
        seen.append(event.token)
        if len(seen) == 45:
            cancel.set()

    opts = GenerationOptions(max_tokens=200, sampling=GREEDY, cancel=cancel)
    done = run_slots(eng, NGRAM, [(2, prompt, opts)], on_token)[2]
    full = run_slots(eng, None, [(2, prompt, GenerationOptions(max_tokens=200, sampling=GREEDY))])
    assert done.stop_type == "cancel"
    # A step hands over its tokens together (the verified run): the cancel set after the 45th
    # ends the reply at the first token the next step samples, the text the plain reply's.
    assert list(done.tokens) == list(full[2].tokens[: len(done.tokens)])
    assert 45 < len(done.tokens) <= 45 + NGRAM.max_draft + 1
    assert done.timings.draft_n > 0


def test_three_slots_speculate_together_each_on_its_own_history(eng: Any) -> None:
    prompts = [
        eng.tokenize(REWRITE),
        eng.tokenize(REWRITE.replace("Peter", "Anna")),
        eng.tokenize("Write a short poem about the sea.\n"),
    ]
    opts = GenerationOptions(max_tokens=80, sampling=GREEDY)
    plain = run_slots(eng, None, [(i, p, opts) for i, p in enumerate(prompts)])
    fast = run_slots(eng, NGRAM, [(i, p, opts) for i, p in enumerate(prompts)])
    for i in range(2):  # the rewrites copy their own text: most of it drafted and kept
        t = fast[i].timings
        assert t.draft_n_accepted > 0.5 * len(fast[i].tokens), i
    # Decoded beside the same others, with or without drafts: the same text up to where the
    # batches' numerics part (llama.cpp's near-ties); the copied texts hold far longer.
    for i in range(3):
        a, b = list(plain[i].tokens), list(fast[i].tokens)
        n = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        assert n >= (40 if i < 2 else 1), (i, n)


def test_a_context_shift_on_a_speculating_slot_gives_the_same_text(model_path: Path) -> None:
    from localfab.engine import Engine, EngineSettings

    settings = EngineSettings(
        n_ctx=512,
        n_batch=256,
        n_seq_max=2,
        warmup=False,
        batch_invariant=True,
        type_k="q8_0",
        type_v="q8_0",
    )  # 256 per slot
    with Engine(model_path, settings) as small:
        prompt = small.tokenize("Repeat after me: " + TEXT)
        shifts: list[int] = []

        def make_room(generated: list[int]) -> list[int]:
            shifts.append(len(generated))
            return list(prompt[:2]) + generated[-100:-1]

        def opts() -> GenerationOptions:
            return GenerationOptions(
                max_tokens=300,
                sampling=SamplingParams(temperature=0, ignore_eos=True),
                on_context_full=make_room,
            )

        plain = run_slots(small, None, [(1, prompt, opts())])[1]
        n_plain = len(shifts)
        fast = run_slots(small, NGRAM, [(1, prompt, opts())])[1]
        assert n_plain >= 1 and len(shifts) == 2 * n_plain
        same(plain, fast)
        assert fast.timings.draft_n_accepted > 0


def test_a_draft_model_drafts_for_each_slot_in_its_own_sequence(model_path: Path) -> None:
    from localfab.engine import Engine, EngineSettings

    settings = EngineSettings(
        n_ctx=1024, n_batch=512, n_seq_max=2, batch_invariant=True, type_k="q8_0", type_v="q8_0"
    )
    with Engine(model_path, settings) as engine:
        draft = engine.load_draft(model_path)
        assert draft.n_seq_max == 2 and draft.n_ctx == engine.n_ctx
        spec = SpecSettings(
            spec_type="draft-simple",
            model_draft=str(model_path),
            draft_max=8,
            draft_p_min=0.0,
            adaptive=False,
        )
        chat = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
        prompts = [engine.tokenize(chat.format(q)) for q in ("Tell me about the sea.", "Hi!")]
        opts = GenerationOptions(max_tokens=40, sampling=GREEDY)
        try:
            plain = {i: run_slots(engine, None, [(i, p, opts)])[i] for i, p in enumerate(prompts)}
            both = [(i, p, opts) for i, p in enumerate(prompts)]
            fast = run_slots(engine, spec, both, None, draft)
        finally:
            draft.close()
        for i in range(2):
            t = fast[i].timings
            assert t.draft_n > 10 and t.draft_n_accepted >= 0.8 * t.draft_n, i
            # The draft model's own sequence for this slot holds this slot's text.
            a, b = list(plain[i].tokens), list(fast[i].tokens)
            n = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
            assert n >= 10, (i, n)


def test_a_full_shared_pool_retries_the_step_without_its_drafts(model_path: Path) -> None:
    """With --kv-unified the slots share one pool: when a step's drafts do not fit it, the step
    runs again without them, and a reply ends for want of room only when the pool is full."""
    from localfab.engine import Engine, EngineSettings
    from localfab.engine.batch import BatchDecoder

    pool = 512
    settings = EngineSettings(
        n_ctx=pool,
        n_batch=512,
        n_seq_max=2,
        kv_unified=True,
        batch_invariant=True,
        type_k="q8_0",
        type_v="q8_0",
        warmup=False,
    )
    with Engine(model_path, settings) as engine:
        prompts = [engine.tokenize(REWRITE), engine.tokenize(REWRITE.replace("Peter", "Anna"))]
        opts = GenerationOptions(
            max_tokens=400, sampling=SamplingParams(temperature=0, ignore_eos=True)
        )
        engine.set_speculation(NGRAM)
        decoder = BatchDecoder(engine)
        try:
            for i, prompt in enumerate(prompts):
                decoder.start(decoder.slots[i], prompt, opts)
            held_at_cut = None
            done: dict[int, Done] = {}
            while decoder.busy:
                for res in decoder.step():
                    assert res.error is None
                    for event in res.events:
                        if isinstance(event, Done):
                            done[res.slot.id] = event
                            if event.stop_type == "context" and held_at_cut is None:
                                held_at_cut = sum(len(s.kv.cached) for s in decoder.slots)
                assert_no_rejected_cells(decoder)
        finally:
            decoder.close()
            engine.set_speculation(None)
        assert held_at_cut is not None, "no reply ran out of room"
        # A plain step needs one cell per slot: it failed with fewer than two free.
        assert held_at_cut >= pool - 1, held_at_cut
        assert sum(d.timings.draft_n_accepted for d in done.values()) > 0
