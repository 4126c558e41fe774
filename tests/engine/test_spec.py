"""Speculative decoding in the engine: n-gram and draft-model drafts, verified by the model.

At temperature 0 a speculative reply must be the plain reply token for token, whatever ends it
(a stop string inside a drafted run, a grammar, a cancel, a full window that shifts), and the KV
cache must never keep the cells of drafted tokens the model did not take.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localfab.engine import Done, SamplingParams, TokenEvent
from localfab.engine.spec import VERIFY_ROWS, NgramDraft, SpecCosts, Tuner, fill_tiles, propose
from localfab.engine.types import DRAFT_MAX_LOOKUP, SpecSettings, Timings
from localfab.errors import UsageError

TEXT = (
    "The old lighthouse stood on the rocky point for more than a century. Its keeper, a quiet "
    "man named Thomas, climbed the spiral stairs every evening to light the lamp. Ships passing "
    "in the night relied on its steady beam to avoid the dangerous reef below. In winter the "
    "storms were fierce, and waves crashed against the walls, but the light never failed."
)
REWRITE = (
    "<start_of_turn>user\nRewrite the following text exactly, but change the name Thomas to "
    f"Peter:\n\n{TEXT}<end_of_turn>\n<start_of_turn>model\n"
)
NGRAM = SpecSettings(spec_type="ngram-simple", adaptive=False)
GREEDY = SamplingParams.greedy()


# --- the pieces, without the model ------------------------------------------------------------


def test_ngram_lookup_proposes_what_followed_the_last_ngram() -> None:
    d = NgramDraft()
    d.reset([1, 2, 3, 4, 5, 6, 7, 8])
    assert d.draft(4) == []  # the last n-gram has not been seen before
    for tok in (2, 3):
        d.push(tok)
    assert d.draft(3) == [4, 5, 6]  # "2 3" was followed by 4 5 6
    d.push(9)  # "2 3 9": no 4-, 3- or 2-gram ending in 9 seen before
    assert d.draft(3) == []
    d.push(2)
    d.push(3)
    # The copy of "2 3 4 ..." was left for "9" and "2 3" picks it up again: the text goes on.
    assert d.draft(5) == [4, 5, 6, 7, 8]
    # Nothing copied yet: the latest occurrence wins ("2 3" was last followed by 9), and a
    # text that runs into the end of the history goes on repeating.
    d.reset([1, 2, 3, 4, 5, 6, 7, 8, 2, 3, 9, 2, 3])
    assert d.draft(5) == [9, 2, 3, 9, 2]


def test_ngram_lookup_picks_a_copy_up_past_a_cut() -> None:
    # A rewrite that leaves a part out: ". In" occurs after the cut and, earlier, in a part
    # already copied; the copy goes on from the first occurrence past where it was.
    text = [10, 11, 12, 1, 2, 13, 14, 15, 16, 17, 1, 2, 18, 19, 20, 21]  # 1 2 is ". In"
    d = NgramDraft()
    d.reset([*text, 99, 10, 11, 12, 1])
    assert d.draft(3) == [2, 13, 14]  # copying the start of the text
    for tok in (2, 13, 14):  # the copy holds
        d.push(tok)
    assert d.draft(2) == [15, 16] and d.copy_at == 7
    for tok in (1, 2):  # 15 16 17 left out: ". In" again
        d.push(tok)
    assert d.draft(4) == [18, 19, 20, 21]  # not 13 14 from the part already copied


def test_a_repeating_loop_is_drafted_past_the_end_of_the_history() -> None:
    d = NgramDraft()
    d.reset([7, 1, 2, 3, 1, 2, 3, 1, 2])
    assert d.draft(7) == [3, 1, 2, 3, 1, 2, 3]
    assert d.agreement == 5  # as far back as the loop has held before the match


def test_a_verify_fills_whole_tiles_of_the_matrix_kernels() -> None:
    assert VERIFY_ROWS == 4
    assert fill_tiles(4, 48) == 7  # 5 rows: the tile's other 3 rows come free
    assert fill_tiles(8, 48) == 11
    assert fill_tiles(47, 48) == 47 and fill_tiles(48, 48) == 47  # 49 rows: one fewer
    assert fill_tiles(5, 6) == 3  # not enough drafted for 8 rows: 4
    assert fill_tiles(2, 48) == 2 and fill_tiles(1, 1) == 1  # under one tile: as asked
    assert fill_tiles(3, 3) == 3


def test_ngram_lookup_prefers_the_longest_match() -> None:
    d = NgramDraft()
    d.reset([5, 1, 2, 7, 9, 1, 2, 8, 5, 1, 2])
    # "1 2" last led to 8, but "5 1 2" led to 7.
    assert d.draft(1) == [7]


def test_ngram_lookup_says_how_long_the_copy_has_held() -> None:
    d = NgramDraft()
    source = list(range(10, 40))  # a text of 30 distinct tokens
    d.reset([*source, 99, *source[:12]])  # an instruction, then the copy's first 12 tokens
    assert d.draft(8) == source[12:20]
    assert d.agreement == 8  # as far back as asked: the copy has held for 12
    # Past the source the history goes on (the instruction's end, the copy so far).
    assert d.draft(30)[:18] == source[12:30] and d.agreement == 12
    d.push(77)  # the copy parts here: an edit
    for tok in source[13:15]:
        d.push(tok)
    assert d.draft(30)[:15] == source[15:30]
    assert d.agreement == 2  # only the two tokens since the edit agree


def test_a_lookup_drafts_a_copy_as_far_again_as_it_has_held() -> None:
    d = NgramDraft()
    source = list(range(100, 160))
    d.reset([*source, 1, *source[:20]])
    sure = Tuner(SpecCosts(), k_max=48)  # costs unknown: the tuner asks for all it may
    # Held for 20: 20 more, and 3 besides to fill the verify's last tile of 4 rows.
    assert propose(sure, d, 48) == source[20:43]
    assert propose(sure, d, 10) == source[20:27]  # never past the limit (8 rows)
    d.reset([*source, 1, *source[:20], 2, *source[22:24]])  # an edit 3 tokens back
    assert propose(sure, d, 48) == source[24:31]  # held for 2: the shortest draft, 4 (to 7)
    thin = Tuner(SpecCosts(one=0.010, per_draft=0.004), k_max=48, accept=0.55)
    assert thin.length(48) == 1
    assert propose(thin, d, 48) == source[24:26]  # the tuner asks for fewer: as far as it held
    off = Tuner(SpecCosts(one=0.010, per_draft=0.010), k_max=48, accept=0.1)
    assert propose(off, d, 48) == []  # drafts do not pay: decode plainly
    fixed = Tuner(SpecCosts(), adaptive=False, k_max=48)  # tests and benchmarks
    assert propose(fixed, d, 48)[:36] == source[24:60]  # all the lookup allows


def test_the_tuner_drafts_while_drafts_pay_and_stops_when_they_do_not() -> None:
    costs = SpecCosts(one=0.010, per_draft=0.002)
    tuner = Tuner(costs, k_max=16)
    for _ in range(5):
        tuner.verify(8, 8, 0.026)
    assert tuner.length(16) >= 4
    for _ in range(10):
        tuner.verify(4, 0, 0.018)
    assert tuner.length(16) == 0  # it would cost more than it saves
    for _ in range(10):
        tuner.guess(True)  # the text repeats again
    assert tuner.length(16) > 0
    assert tuner.length(2) <= 2
    # Drafting that costs as much per token as a decode never pays.
    assert Tuner(SpecCosts(one=0.01, per_draft=0.01), accept=0.5).length(16) == 0


def test_short_drafts_do_not_make_long_drafts_look_dear() -> None:
    # As measured on a 2-core CPU: one token 17 ms, a verify of 1 drafted token 31 ms (a batch of
    # two costs nearly two decodes), one of 16 drafted tokens 107 ms (6 ms per token).
    costs = SpecCosts(one=0.017)
    tuner = Tuner(costs, k_max=16)
    for _ in range(5):
        tuner.verify(1, 1, 0.031)
    tuner.verify(16, 16, 0.107)
    tuner.verify(1, 1, 0.031)
    assert costs.verify(16) == pytest.approx(0.107, rel=0.05)
    assert costs.verify(1) == pytest.approx(0.031, rel=0.05)
    assert tuner.length(16) == 15  # every draft was kept: as long as allowed in whole tiles
    # Verifies of one length only: the fixed part is a decode, the rest is per drafted token.
    same = SpecCosts(one=0.017)
    for _ in range(3):
        same.took_verify(0.107, 16)
    assert same.verify(0) == 0.017 and same.verify(16) == pytest.approx(0.107)


def test_a_cost_measured_in_a_busy_moment_is_measured_again_while_guesses_are_right() -> None:
    # A verify that happened to be slow: each drafted token seemed to cost a whole decode.
    tuner = Tuner(SpecCosts(one=0.010, per_draft=0.010), k_max=16)
    for _ in range(20):
        tuner.guess(True)  # the text repeats: drafts would be kept
    assert tuner.length(16) == 0
    lengths = []
    for _ in range(40):
        tuner.plain(0.010)
        lengths.append(tuner.length(16))
    # One short draft after a while, not a draft every token.
    assert sorted(lengths)[-2:] == [0, 3]
    tuner.verify(4, 4, 0.012)  # verifying is cheap after all
    assert tuner.length(16) > 0
    # Where guesses are wrong (text that does not repeat), no probing at all.
    cold = Tuner(SpecCosts(one=0.010, per_draft=0.010), k_max=16, accept=0.1)
    probes = []
    for _ in range(100):
        cold.plain(0.010)
        cold.guess(False)
        probes.append(cold.length(16))
    assert probes == [0] * 100


def test_timings_show_drafts_only_for_a_reply_that_drafted() -> None:
    assert "draft_n" not in Timings().to_dict()
    t = Timings(draft_n=10, draft_n_accepted=7).to_dict()
    assert (t["draft_n"], t["draft_n_accepted"]) == (10, 7)
    assert Timings(draft_n=10, draft_n_accepted=7).draft_acceptance == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (SpecSettings(spec_type="ngram-simple", draft_max=0), "--draft-max must be 1 to 64"),
        (SpecSettings(spec_type="ngram-simple", draft_max=65), "--draft-max must be 1 to 64"),
        (SpecSettings(spec_type="ngram-simple", draft_max=16, draft_min=20), "--draft-min"),
        (SpecSettings(spec_type="draft-simple", model_draft="d", draft_min=20), "--draft-min"),
        (SpecSettings(spec_type="ngram-simple", draft_p_min=1.5), "--draft-p-min"),
        (SpecSettings(spec_type="draft-simple"), "needs a draft model"),
        (SpecSettings(spec_type="ngram-map"), "--spec-type must be one of"),  # type: ignore[arg-type]
    ],
)
def test_bad_speculation_settings_are_one_clear_line(settings: SpecSettings, words: str) -> None:
    with pytest.raises(UsageError, match=words) as info:
        settings.check()
    assert "\n" not in str(info.value)


def test_exact_speculation_loads_batch_invariant_kernels_and_a_q8_0_cache() -> None:
    from dataclasses import replace

    from localfab.engine import EngineSettings

    planned = EngineSettings(n_ctx=1024, n_threads=2)
    loaded, notice = SpecSettings(spec_type="ngram-simple").load_settings(planned)
    assert loaded == replace(planned, batch_invariant=True, type_k="q8_0", type_v="f16")
    assert notice is not None and "KV cache K q8_0, V f16 (planned: f16)" in notice
    # A cache type the user gave (-ctk/-ctv) stays; the kernels still change.
    loaded, notice = SpecSettings(spec_type="ngram-simple").load_settings(planned, keep_cache=True)
    assert loaded == replace(planned, batch_invariant=True)
    assert notice is not None and "KV cache" not in notice
    # A cache whose K and V differ, or that is quantized or bf16, stays: one token and a batch
    # take the same flash-attention path over it.
    for k, v in (("q4_0", "q4_0"), ("q8_0", "f16"), ("f16", "q8_0"), ("bf16", "bf16")):
        other = replace(planned, type_k=k, type_v=v)
        loaded, notice = SpecSettings(spec_type="ngram-simple").load_settings(other)
        assert loaded == replace(other, batch_invariant=True)
        assert notice is not None and "KV cache" not in notice
    # Left as planned: no speculation, --no-spec-exact, layers on a GPU (other kernels), and
    # no flash attention (a quantized V cache needs it).
    for spec, settings in (
        (SpecSettings(), planned),
        (SpecSettings(spec_type="ngram-simple", exact=False), planned),
        (SpecSettings(spec_type="ngram-simple"), replace(planned, n_gpu_layers=12)),
        (SpecSettings(spec_type="ngram-simple"), replace(planned, flash_attn="off")),
    ):
        assert spec.load_settings(settings) == (settings, None)


# --- on the real model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eng(model_path: Path) -> Iterator[Any]:
    from localfab.engine import Engine, EngineSettings

    # As `run` loads a model for exact speculation (one-token kernels, a q8_0 K cache).
    settings = EngineSettings(n_ctx=2048, n_batch=512)
    engine = Engine(model_path, SpecSettings(spec_type="ngram-simple").load_settings(settings)[0])
    yield engine
    engine.close()


def assert_no_rejected_cells(engine: Any) -> None:
    """llama.cpp's cache holds exactly the cells the engine's mirror says, no drafted extras."""
    kv = engine.kv
    assert kv.pos_max() + 1 == len(kv.cached)


def assert_cache_after(engine: Any, prompt: list[int], done: Done) -> None:
    """As after a plain reply: the prompt and every token but the last (all of them at eos)."""
    assert_no_rejected_cells(engine)
    kept = list(done.tokens) if done.stop_type == "eos" else list(done.tokens[:-1])
    assert engine.cached_tokens == prompt + kept


def both(
    engine: Any, prompt: list[int], spec: SpecSettings | None = NGRAM, **kw: Any
) -> tuple[Done, Done]:
    """The plain reply and the speculative one, each from an empty cache."""
    engine.set_speculation(None)
    engine.clear_cache()
    plain = engine.generate(prompt, **kw)
    engine.set_speculation(spec)
    try:
        engine.clear_cache()
        fast = engine.generate(prompt, **kw)
        assert_cache_after(engine, prompt, fast)
    finally:
        engine.set_speculation(None)
    return plain, fast


Shifted = tuple[Done, list[int], int]  # a reply, the cache after it, how many shifts it made


def same_after_shifts(plain: Shifted, fast: Shifted) -> None:
    """A reply that shifted the window: the speculative run shifted as often, ended with the same
    text and cache, and drafted tokens that were kept."""
    assert plain[2] >= 1 and fast[2] == plain[2]
    same(plain[0], fast[0])
    assert fast[1] == plain[1]
    assert fast[0].timings.draft_n_accepted > 0


def same(a: Done, b: Done) -> None:
    assert b.tokens == a.tokens
    assert (b.text, b.stop_type, b.finish_reason, b.stopping_word) == (
        a.text,
        a.stop_type,
        a.finish_reason,
        a.stopping_word,
    )


def test_greedy_rewrite_is_token_identical_and_mostly_drafted(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    plain, fast = both(eng, prompt, max_tokens=110, sampling=GREEDY)
    same(plain, fast)
    assert len(fast.tokens) == 110
    t = fast.timings
    # The reply copies the text: most tokens come from verified drafts.
    assert t.draft_n > 50 and t.draft_n_accepted > 0.8 * t.draft_n
    assert t.draft_n_accepted < len(fast.tokens)
    assert plain.timings.draft_n == 0


def test_verifies_hold_no_more_tokens_than_llama_cpp_computes_exactly(model_path: Path) -> None:
    from localfab.engine import Engine, EngineSettings

    with Engine(model_path, EngineSettings(n_ctx=512, n_batch=512)) as repacked:
        repacked.set_speculation(SpecSettings(spec_type="ngram-simple", draft_max=16))
        exact = repacked.speculation_batch
        # Repacked weights use other kernels from 4 tokens on (on CPUs that repack), whose rows
        # round as one token's only sometimes: verifies stay within 3 there.
        assert 1 <= exact <= (3 if repacked.buffers.repacked_bytes else 17)
        repacked.set_speculation(SpecSettings(spec_type="ngram-simple", exact=False))
        assert repacked.speculation_batch == DRAFT_MAX_LOOKUP + 1
        prompt = repacked.tokenize(REWRITE)
        plain, fast = both(
            repacked,
            prompt,
            SpecSettings(spec_type="ngram-simple", adaptive=False),
            max_tokens=110,
            sampling=GREEDY,
        )
        same(plain, fast)
        if exact > 1:
            assert fast.timings.draft_n_accepted > 0


def test_past_256_tokens_of_an_f16_cache_no_draft_is_verified(model_path: Path) -> None:
    from localfab.engine import Engine, EngineSettings
    from localfab.engine.spec.exactness import exact_batch
    from localfab.runtime import start_speculation

    prompt_text = TEXT * 6
    with Engine(model_path, EngineSettings(n_ctx=1024, n_batch=512, repack=False)) as engine:
        # One token's attention is split over the threads there, a batch's is not.
        within, past = exact_batch(engine, DRAFT_MAX_LOOKUP + 1)
        assert within > 1 and past == 1
        notice = start_speculation(engine, SpecSettings(spec_type="ngram-simple"))
        assert "none past them" in notice and "-ctk q8_0" in notice
        assert engine.speculation_batch == within and engine.speculation_batch_past == 1
        prompt = engine.tokenize(prompt_text)[:300]
        engine.clear_cache()
        done = engine.generate(prompt, max_tokens=40, sampling=GREEDY)
        # A copy it would draft all of, but no verify goes past 256 cells.
        assert done.timings.draft_n == 0
        engine.set_speculation(None)


@pytest.mark.parametrize(("type_k", "type_v"), [("q8_0", "q8_0"), ("q8_0", "f16"), ("f16", "q8_0")])
def test_with_a_quantized_cache_a_verify_past_256_tokens_is_bit_exact(
    model_path: Path, type_k: str, type_v: str
) -> None:
    # With an f16 cache llama.cpp decodes one token past 256 cells with another flash-attention
    # kernel than a batch (see spec.py); with q8_0 K or V both take the same one, so a verify of
    # up to `exact_batch` tokens gives plain decoding's logits at any length.
    import numpy as np

    from localfab.engine import Engine, EngineSettings

    settings = EngineSettings(n_ctx=1024, n_batch=512, repack=False, type_k=type_k, type_v=type_v)
    with Engine(model_path, settings) as engine:
        engine.set_speculation(SpecSettings(spec_type="ngram-simple", draft_max=16))
        n = engine.speculation_batch
        assert n >= 2
        kv = engine.kv
        prompt = engine.tokenize(TEXT * 6)[:400]
        kv.clear()
        kv.decode(prompt, 0)
        tokens, want = [], []
        for _ in range(n):  # plain decoding, one token at a time
            tokens.append(int(kv.logits().argmax()))
            kv.decode_one(tokens[-1])
            want.append(kv.logits().copy())
        kv.truncate(len(prompt))
        rows = kv.decode_rows(tokens, len(prompt))
        assert all(np.array_equal(rows[i], want[i]) for i in range(n))
        kv.clear()


def test_adaptive_speculation_gives_the_same_text(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    plain, fast = both(
        eng, prompt, SpecSettings(spec_type="ngram-simple"), max_tokens=110, sampling=GREEDY
    )
    same(plain, fast)
    assert fast.timings.draft_n_accepted > 0


def test_a_stop_string_inside_a_drafted_run_stops_at_the_same_token(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    _, full = both(eng, prompt, max_tokens=110, sampling=GREEDY)
    past = 0
    # Words well inside the copied text, where drafts are long runs.
    for stop in ("spiral stairs", "steady beam", "dangerous reef"):
        assert stop in full.text
        plain, fast = both(eng, prompt, max_tokens=110, sampling=GREEDY, stop=[stop])
        same(plain, fast)
        assert fast.stop_type == "word" and fast.stopping_word == stop
        assert fast.text.endswith(full.text[: full.text.index(stop)][-20:])
        # Drafted tokens after the stop were verified but never shown.
        past += fast.timings.draft_n > fast.timings.draft_n_accepted
    assert past >= 1


def test_max_tokens_inside_a_drafted_run(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    for n in (1, 2, 37):
        plain, fast = both(eng, prompt, max_tokens=n, sampling=GREEDY)
        same(plain, fast)
        assert len(fast.tokens) == n


def test_a_grammar_constrained_reply_is_token_identical(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    grammar = 'root ::= [A-Za-z ,.\\n:]+ "."'
    sampling = SamplingParams(temperature=0, grammar=grammar)
    plain, fast = both(eng, prompt, max_tokens=80, sampling=sampling)
    same(plain, fast)
    assert fast.timings.draft_n_accepted > 10
    assert set(fast.text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz ,.\n:")


def test_logit_bias_and_n_probs_match_plain_decoding(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    banned = eng.tokenize(" lighthouse", add_special=False)[0]
    sampling = SamplingParams(temperature=0, logit_bias=((banned, float("-inf")),))
    plain, fast = both(eng, prompt, max_tokens=60, sampling=sampling)
    same(plain, fast)
    assert banned not in fast.tokens

    def probs(spec: SpecSettings | None) -> list[Any]:
        eng.set_speculation(spec)
        try:
            eng.clear_cache()
            events = list(eng.stream(prompt, max_tokens=40, sampling=GREEDY, n_probs=3))
        finally:
            eng.set_speculation(None)
        return [
            (e.token, e.probs.top[0][0] if e.probs else None)
            for e in events
            if isinstance(e, TokenEvent)
        ]

    assert probs(NGRAM) == probs(None)


def test_a_cancel_stops_at_the_same_token(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)

    def cancelled(spec: SpecSettings | None) -> Done:
        eng.set_speculation(spec)
        try:
            eng.clear_cache()
            cancel = threading.Event()
            n = 0
            done = None
            for event in eng.stream(prompt, max_tokens=200, sampling=GREEDY, cancel=cancel):
                if isinstance(event, Done):
                    done = event
                    continue
                n += 1
                if n == 45:  # inside a drafted run: the next tokens are already verified
                    cancel.set()
            assert done is not None
            assert_cache_after(eng, prompt, done)
            return done
        finally:
            eng.set_speculation(None)

    plain, fast = cancelled(None), cancelled(NGRAM)
    same(plain, fast)
    assert fast.stop_type == "cancel" and len(fast.tokens) == 45
    assert fast.timings.draft_n > 0


def test_closing_the_stream_mid_run_leaves_no_rejected_cells(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    eng.set_speculation(NGRAM)
    try:
        eng.clear_cache()
        stream = eng.stream(prompt, max_tokens=200, sampling=GREEDY)
        tokens = []
        for event in stream:
            tokens.append(event.token)
            if len(tokens) == 30:
                break
        stream.close()
        assert_no_rejected_cells(eng)
        # What is cached is the prompt and the reply up to the token being taken.
        assert eng.cached_tokens == prompt + tokens[:-1]
        # And the next reply reuses it as a prefix, as after plain decoding.
        done = eng.generate(prompt + tokens, max_tokens=5, sampling=GREEDY)
        assert done.timings.cache_n >= len(prompt)
    finally:
        eng.set_speculation(None)


def test_top_tokens_after_a_verify_that_cut_its_draft_read_the_last_kept_token(eng: Any) -> None:
    # A verify that keeps part of its draft leaves llama.cpp's last output row on a rejected
    # token (a reply that ends right there, at eos or a stop string, leaves it so); what follows
    # the last kept token must be read from that token's own row.
    prompt = eng.tokenize(REWRITE)
    eng.clear_cache()
    eng.evaluate(prompt[:-1])
    kv = eng.kv
    draft = eng.tokenize(" the lighthouse keeper wound the clock", add_special=False)
    kv.decode_rows([prompt[-1], *draft], len(prompt) - 1)
    kv.truncate(len(prompt) + 2)  # kept: the pending token and two drafted ones
    cut = eng.top_tokens(3)
    assert eng.cached_tokens == prompt + draft[:2]
    eng.clear_cache()
    eng.evaluate(prompt + draft[:2])
    fresh = eng.top_tokens(3)
    # A batch of eight and a fresh evaluation round differently (logits a few tenths apart, the
    # third token a near-tie); the row of a rejected token predicts something else entirely.
    assert [t for t, _ in cut[:2]] == [t for t, _ in fresh[:2]]
    eng.clear_cache()
    assert eng.top_tokens(3) == []  # nothing evaluated: no logits to read


def test_the_cache_has_no_rejected_cells_after_every_step(eng: Any) -> None:
    prompt = eng.tokenize(REWRITE)
    eng.set_speculation(NGRAM)
    try:
        eng.clear_cache()
        reply: list[int] = []
        for event in eng.stream(prompt, max_tokens=80, sampling=GREEDY):
            assert_no_rejected_cells(eng)
            if isinstance(event, TokenEvent):
                reply.append(event.token)
                # Never more than the prompt, the tokens taken so far and a verified run.
                assert len(eng.cached_tokens) <= len(prompt) + len(reply) + 64
        assert_no_rejected_cells(eng)
    finally:
        eng.set_speculation(None)


@pytest.fixture()
def small(model_path: Path) -> Iterator[Any]:
    from localfab.engine import Engine, EngineSettings

    engine = Engine(model_path, EngineSettings(n_ctx=256, n_batch=256, warmup=False, repack=False))
    yield engine
    engine.close()


def test_a_context_shift_during_a_reply_gives_the_same_text(small: Any) -> None:
    prompt = small.tokenize("Repeat after me: " + TEXT)

    def run(spec: SpecSettings | None) -> tuple[Done, list[int], int]:
        calls: list[int] = []

        def make_room(generated: list[int]) -> list[int]:
            calls.append(len(generated))
            return list(prompt[:2]) + generated[-100:-1]

        small.set_speculation(spec)
        try:
            small.clear_cache()
            done = small.generate(
                prompt,
                max_tokens=300,
                sampling=SamplingParams(temperature=0, ignore_eos=True),
                on_context_full=make_room,
            )
            assert_no_rejected_cells(small)
            return done, small.cached_tokens, len(calls)
        finally:
            small.set_speculation(None)

    plain, plain_cache, plain_shifts = run(None)
    fast, fast_cache, fast_shifts = run(NGRAM)
    same_after_shifts((plain, plain_cache, plain_shifts), (fast, fast_cache, fast_shifts))


# --- the test model as its own draft -----------------------------------------------------------


@pytest.fixture(scope="module")
def drafted(model_path: Path) -> Iterator[Any]:
    from localfab.engine import Engine, EngineSettings

    engine = Engine(
        model_path,
        EngineSettings(n_ctx=512, n_batch=512, batch_invariant=True, type_k="q8_0", type_v="q8_0"),
    )
    draft = engine.load_draft(model_path)
    engine.set_speculation(
        SpecSettings(
            spec_type="draft-simple",
            model_draft=str(model_path),
            draft_max=8,
            draft_p_min=0.0,
            adaptive=False,
        ),
        draft,
    )
    yield engine
    engine.close()


def test_a_draft_model_gives_the_same_text_and_is_mostly_right(drafted: Any) -> None:
    prompt = drafted.tokenize(
        "<start_of_turn>user\nTell me about the sea.<end_of_turn>\n<start_of_turn>model\n"
    )
    spec = drafted.speculation
    drafted.clear_cache()
    fast = drafted.generate(prompt, max_tokens=60, sampling=GREEDY)
    assert_cache_after(drafted, prompt, fast)
    draft = drafted.draft_engine
    drafted.set_speculation(None, draft)
    drafted.clear_cache()
    plain = drafted.generate(prompt, max_tokens=60, sampling=GREEDY)
    drafted.set_speculation(spec, draft)
    same(plain, fast)
    t = fast.timings
    # The model drafting for itself is right nearly always (numerics aside).
    assert t.draft_n > 20 and t.draft_n_accepted >= 0.8 * t.draft_n


def test_the_draft_model_stays_in_sync_across_turns(drafted: Any) -> None:
    first = drafted.tokenize(
        "<start_of_turn>user\nName three colours.<end_of_turn>\n<start_of_turn>model\n"
    )
    drafted.clear_cache()
    one = drafted.generate(first, max_tokens=20, sampling=GREEDY)
    second = (
        first
        + list(one.tokens)
        + drafted.tokenize(
            "<end_of_turn>\n<start_of_turn>user\nAnd three animals.<end_of_turn>\n"
            "<start_of_turn>model\n",
            add_special=False,
        )
    )
    two = drafted.generate(second, max_tokens=20, sampling=GREEDY)
    assert two.timings.cache_n >= len(first)
    draft_kv = drafted.draft_engine.kv
    # The draft's cache holds the conversation and nothing but it, up to its last draft.
    assert draft_kv.pos_max() + 1 == len(draft_kv.cached)
    assert draft_kv.cached[: len(second)] == second
    assert two.timings.draft_n_accepted > 0


def test_a_draft_with_another_vocabulary_is_refused(
    model_path: Path, tmp_path: Path, drafted: Any
) -> None:
    vocab_text = drafted.token_text(5 + 32 * 100)
    data = bytearray(model_path.read_bytes())
    raw = vocab_text.encode()
    needle = len(raw).to_bytes(8, "little") + raw
    at = data.find(needle)
    assert at > 0
    data[at + 8 : at + 8 + len(raw)] = b"q" * len(raw)
    other = tmp_path / "other-vocab.gguf"
    other.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="cannot draft for .*token 3205 differs"):
        drafted.load_draft(other)


def test_a_missing_or_corrupt_draft_is_one_clear_error(drafted: Any, tmp_path: Path) -> None:
    from localfab.errors import LocalfabError

    with pytest.raises(LocalfabError) as info:
        drafted.load_draft(tmp_path / "nope.gguf")
    assert "\n" not in str(info.value)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(LocalfabError) as info:
        drafted.load_draft(bad)
    assert "\n" not in str(info.value)


# --- temperature > 0 ---------------------------------------------------------------------------


def chi_square_homogeneity(a: list[int], b: list[int]) -> tuple[float, int]:
    """Pearson's statistic that samples `a` and `b` come from one distribution, and its dof.

    Categories expected fewer than 5 times in either sample are pooled into one.
    """
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    total = na + nb
    cells: dict[object, tuple[int, int]] = {}
    for tok in set(ca) | set(cb):
        joint = ca[tok] + cb[tok]
        key = tok if min(na, nb) * joint / total >= 5 else "pooled"
        x, y = cells.get(key, (0, 0))
        cells[key] = (x + ca[tok], y + cb[tok])
    stat = 0.0
    for x, y in cells.values():
        joint = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = n * joint / total
            stat += (observed - expected) ** 2 / expected
    return stat, max(len(cells) - 1, 0)


def chi_square_critical(dof: int, z: float) -> float:
    """The chi-square quantile for a normal quantile z (Wilson-Hilferty)."""
    h = 2.0 / (9.0 * dof)
    return float(dof * (1.0 - h + z * h**0.5) ** 3)


@pytest.mark.slow
def test_sampling_at_drafted_positions_keeps_the_distribution(eng: Any) -> None:
    """Tokens 2-5 of a reply that copies its prompt, over many seeds, with and without drafts.

    Different seeds on each side make the samples independent; a chi-square test of
    homogeneity at significance 0.001 per position (z = 3.09) must not reject. The first token
    is never drafted, so it is left out.
    """
    prompt = eng.tokenize(REWRITE)
    n = 100

    def sample(spec: SpecSettings | None, seeds: range) -> tuple[list[list[int]], int]:
        eng.set_speculation(spec)
        try:
            eng.clear_cache()
            rows: list[list[int]] = [[] for _ in range(4)]
            drafted = 0
            for seed in seeds:
                params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=seed)
                done = eng.generate(prompt, max_tokens=5, sampling=params)
                tokens = list(done.tokens) + [-1] * (5 - len(done.tokens))  # -1: ended early
                for i in range(4):
                    rows[i].append(tokens[i + 1])
                drafted += done.timings.draft_n_accepted
            return rows, drafted
        finally:
            eng.set_speculation(None)

    plain, _ = sample(None, range(n))
    fast, drafted = sample(NGRAM, range(n, 2 * n))
    assert drafted > n  # most of these tokens came from verified drafts
    for i in range(4):
        stat, dof = chi_square_homogeneity(plain[i], fast[i])
        if dof:
            assert stat < chi_square_critical(dof, 3.09), (i, stat, dof)
    # And with equal seeds the tokens are the very same: one sampler, one random stream.
    same_seeds, _ = sample(NGRAM, range(20))
    plain_seeds, _ = sample(None, range(20))
    assert same_seeds == plain_seeds


def test_the_draft_model_follows_a_context_shift(model_path: Path) -> None:
    from localfab.engine import Engine, EngineSettings

    settings = EngineSettings(n_ctx=256, n_batch=256, warmup=False, repack=False)
    with Engine(model_path, settings) as engine:
        prompt = engine.tokenize("Repeat after me: " + TEXT)
        spec = SpecSettings(
            spec_type="draft-simple",
            model_draft=str(model_path),
            draft_max=6,
            draft_p_min=0.0,
            adaptive=False,
        )

        def run(with_draft: bool) -> tuple[Done, list[int], int]:
            calls: list[int] = []

            def make_room(generated: list[int]) -> list[int]:
                calls.append(len(generated))
                return list(prompt[:2]) + generated[-100:-1]

            if with_draft:
                engine.set_speculation(spec, engine.load_draft(model_path))
            try:
                engine.clear_cache()
                done = engine.generate(
                    prompt,
                    max_tokens=260,
                    sampling=SamplingParams(temperature=0, ignore_eos=True),
                    on_context_full=make_room,
                )
                assert_no_rejected_cells(engine)
                draft = engine.draft_engine
                if draft is not None:
                    draft_kv = draft.kv
                    assert draft_kv.pos_max() + 1 == len(draft_kv.cached)
                    # After the shift the draft holds the shifted window, not the old one, up
                    # to its last draft (it catches up when it drafts next).
                    target = engine.cached_tokens
                    common = 0
                    for a, b in zip(draft_kv.cached, target, strict=False):
                        if a != b:
                            break
                        common += 1
                    assert common >= len(target) - (spec.draft_max + 1)
                return done, engine.cached_tokens, len(calls)
            finally:
                engine.set_speculation(None)

        plain, plain_cache, plain_shifts = run(False)
        fast, fast_cache, fast_shifts = run(True)
    same_after_shifts((plain, plain_cache, plain_shifts), (fast, fast_cache, fast_shifts))
