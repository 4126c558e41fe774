"""Engine tests on the real test model: streaming, detokenization, prefix reuse, stops, cancel."""

from __future__ import annotations

import threading

import pytest

from localfab.engine import Done, SamplingParams, TokenEvent
from localfab.engine.text import StopMatcher, Utf8Stream
from localfab.errors import ContextOverflow, UsageError

GREEDY = SamplingParams.greedy()
PROMPT = "The history of the city of Rome begins"


def collect(engine, tokens, **kw):
    texts: list[str] = []
    done = None
    for ev in engine.stream(tokens, **kw):
        if isinstance(ev, Done):
            done = ev
        else:
            assert isinstance(ev, TokenEvent)
            texts.append(ev.text)
    assert done is not None
    return texts, done


@pytest.mark.model
def test_stream_equals_non_streamed_text(engine):
    tokens = engine.tokenize(PROMPT)
    texts, done = collect(engine, tokens, max_tokens=48, sampling=GREEDY)
    engine.clear_cache()
    again = engine.generate(tokens, max_tokens=48, sampling=GREEDY)
    assert "".join(texts) == done.text == again.text
    assert len(done.tokens) == 48 and done.finish_reason == "length"
    # The streamed text is exactly llama.cpp's own detokenization of the generated tokens.
    assert done.text == engine.detokenize(done.tokens)


MIXED = "汉字和标点，。混合 emoji 🦙🚀👩‍💻 and ASCII: naïve café — 数据 ✅ end"


@pytest.mark.model
def test_incremental_detokenization_of_mixed_text_equals_one_shot(engine):
    tokens = engine.tokenize(MIXED, add_special=False)
    pieces = [engine.token_bytes(t) for t in tokens]
    # The test means something only if some token ends mid-character.
    incomplete = 0
    for piece in pieces:
        try:
            piece.decode("utf-8")
        except UnicodeDecodeError:
            incomplete += 1
    assert incomplete > 0
    stream = Utf8Stream()
    shown = [stream.feed(p) for p in pieces] + [stream.flush()]
    assert all("\ufffd" not in s for s in shown)
    assert "".join(shown) == engine.detokenize(tokens) == MIXED


@pytest.mark.model
def test_generated_multibyte_text_streams_without_broken_characters(engine):
    tokens = engine.tokenize("中文：你好，世界！今天天气很好。我们去公园散步，然后")
    texts, done = collect(engine, tokens, max_tokens=40, sampling=GREEDY)
    assert all("\ufffd" not in t for t in texts)
    assert "".join(texts) == engine.detokenize(done.tokens)


@pytest.mark.model
def test_prefix_reuse_processes_only_new_tokens(engine):
    engine.clear_cache()
    first = engine.tokenize("Once upon a time in a small village by the sea, there lived")
    done1 = engine.generate(first, max_tokens=8, sampling=GREEDY)
    assert done1.timings.cache_n == 0 and done1.timings.prompt_n == len(first)
    second = first + engine.tokenize(" an old fisherman who", add_special=False)
    done2 = engine.generate(second, max_tokens=8, sampling=GREEDY)
    assert done2.timings.cache_n == len(first)
    assert done2.timings.prompt_n == len(second) - len(first)
    # Same prompt again: everything but the last token comes from the cache.
    done3 = engine.generate(second, max_tokens=8, sampling=GREEDY)
    assert done3.timings.cache_n == len(second) - 1 and done3.timings.prompt_n == 1
    assert done3.text == done2.text


@pytest.mark.model
def test_stop_string_ends_the_reply_before_it(engine):
    tokens = engine.tokenize(PROMPT)
    engine.clear_cache()  # both replies from the same cache (see test_seeded_sampling_repeats)
    full = engine.generate(tokens, max_tokens=40, sampling=GREEDY).text
    words = full.split()
    stop = words[len(words) // 2]
    cut = full.index(stop)
    engine.clear_cache()
    done = engine.generate(tokens, max_tokens=40, sampling=GREEDY, stop=[stop])
    assert done.finish_reason == "stop" and done.stop_type == "word"
    assert done.stopping_word == stop
    assert done.text == full[:cut]


def test_stop_matcher_holds_text_that_may_start_a_stop():
    m = StopMatcher(["</end>"])
    assert m.feed("hello </") == "hello "
    assert m.feed("en") == ""
    assert m.feed("x more") == "</enx more"
    assert m.matched is None
    assert m.feed(" a </end> b") == " a "
    assert m.matched == "</end>"


@pytest.mark.model
def test_cancel_stops_generation_and_engine_stays_usable(engine):
    tokens = engine.tokenize(PROMPT)
    reference = engine.generate(tokens, max_tokens=20, sampling=GREEDY)
    cancel = threading.Event()
    seen = 0
    done = None
    for ev in engine.stream(tokens, max_tokens=200, sampling=GREEDY, cancel=cancel):
        if isinstance(ev, Done):
            done = ev
        else:
            seen += 1
            if seen == 3:
                cancel.set()
    assert done is not None and done.finish_reason == "cancelled"
    assert len(done.tokens) == 3
    after = engine.generate(tokens, max_tokens=20, sampling=GREEDY)
    assert after.text == reference.text


@pytest.mark.model
def test_abandoned_stream_releases_the_engine(engine):
    tokens = engine.tokenize(PROMPT)
    gen = engine.stream(tokens, max_tokens=50, sampling=GREEDY)
    next(gen)
    gen.close()
    assert engine.generate(tokens, max_tokens=5, sampling=GREEDY).finish_reason == "length"


@pytest.mark.model
def test_end_of_generation_token_ends_with_stop(engine):
    # A grammar that allows only "OK" leaves the end-of-generation token as the only choice.
    tokens = engine.tokenize("Answer:")
    sampling = SamplingParams(temperature=0.0, grammar='root ::= "OK"')
    done = engine.generate(tokens, max_tokens=50, sampling=sampling)
    assert done.text == "OK"
    assert done.finish_reason == "stop" and done.stop_type == "eos"


@pytest.mark.model
def test_prompt_longer_than_context_names_both_counts(engine):
    tokens = engine.tokenize("word " * 3000)
    with pytest.raises(ContextOverflow) as info:
        engine.generate(tokens, max_tokens=4)
    assert info.value.n_prompt_tokens == len(tokens) and info.value.n_ctx == engine.n_ctx
    assert str(len(tokens)) in str(info.value) and str(engine.n_ctx) in str(info.value)


@pytest.mark.model
@pytest.mark.parametrize("bad", [0, -2])
def test_bad_max_tokens(engine, bad):
    with pytest.raises(UsageError):
        engine.generate(engine.tokenize("hi"), max_tokens=bad)


@pytest.mark.model
def test_out_of_vocabulary_token(engine):
    with pytest.raises(UsageError, match="out of the vocabulary"):
        engine.generate([engine.bos_token, engine.n_vocab + 5], max_tokens=2)


@pytest.mark.model
def test_seeded_sampling_repeats(engine):
    tokens = engine.tokenize(PROMPT)
    p = SamplingParams(temperature=1.0, seed=42)
    # From the same cache: llama.cpp computes a token's row differently in a batch than alone,
    # so a reply also depends on how much of its prompt was cached before (llama-server says the
    # same of cache_prompt); on an AVX-512 CPU that moves a sampled token here.
    engine.clear_cache()
    a = engine.generate(tokens, max_tokens=16, sampling=p).text
    engine.clear_cache()
    b = engine.generate(tokens, max_tokens=16, sampling=p).text
    assert a == b


@pytest.mark.model
def test_drop_span_shifts_without_reprocessing(engine):
    engine.clear_cache()
    head = engine.tokenize("Note: ")
    middle = engine.tokenize(
        " filler words that will be dropped from the window", add_special=False
    )
    tail = engine.tokenize(" The sky is", add_special=False)
    engine.evaluate(head + middle + tail)
    engine.drop_span(len(head), len(head) + len(middle))
    assert engine.cached_tokens == head + tail
    done = engine.generate(head + tail, max_tokens=4, sampling=GREEDY)
    assert done.timings.cache_n == len(head + tail) - 1


@pytest.mark.model
def test_repeat_penalty_and_logit_bias(engine):
    tokens = engine.tokenize(PROMPT)
    plain = engine.generate(tokens, max_tokens=24, sampling=GREEDY)
    penalized = engine.generate(
        tokens, max_tokens=24, sampling=SamplingParams(temperature=0.0, repeat_penalty=1.5)
    )
    assert penalized.finish_reason == "length" and penalized.text != plain.text
    banned = plain.tokens[0]
    biased = engine.generate(
        tokens,
        max_tokens=4,
        sampling=SamplingParams(temperature=0.0, logit_bias=((banned, float("-inf")),)),
    )
    assert biased.tokens[0] != banned


@pytest.mark.model
def test_token_bytes_from_another_thread_during_generation(engine):
    tokens = engine.tokenize(MIXED, add_special=False)
    expected = [engine.token_bytes(t) for t in tokens]
    seen: list[list[bytes]] = []
    gen = engine.stream(engine.tokenize(PROMPT), max_tokens=20, sampling=GREEDY)
    next(gen)
    worker = threading.Thread(target=lambda: seen.append([engine.token_bytes(t) for t in tokens]))
    worker.start()
    for _ in gen:
        pass
    worker.join()
    assert seen == [expected]


@pytest.mark.model
def test_n_probs_are_the_log_softmax_of_the_logits(engine):
    import numpy as np

    prompt = engine.tokenize("The lighthouse keeper climbed the")
    engine.clear_cache()
    engine.evaluate(prompt)
    logits = np.array(engine.kv.logits(), dtype=np.float64)
    log_softmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    expected = np.argsort(-log_softmax, kind="stable")[:5]

    engine.clear_cache()
    events = [
        e
        for e in engine.stream(prompt, max_tokens=3, sampling=SamplingParams.greedy(), n_probs=5)
        if isinstance(e, TokenEvent)
    ]
    first = events[0].probs
    assert first is not None and all(e.probs is not None for e in events)
    assert [t for t, _, _ in first.top] == list(expected)
    for (t, piece, logprob), want in zip(first.top, expected, strict=True):
        assert logprob == pytest.approx(log_softmax[want], abs=1e-4)
        assert piece == engine.token_bytes(t)
    assert events[0].token == expected[0]
    assert first.logprob == pytest.approx(log_softmax[events[0].token], abs=1e-4)
    assert first.piece == engine.token_bytes(events[0].token)
    plain = [e for e in engine.stream(prompt, max_tokens=2) if isinstance(e, TokenEvent)]
    assert all(e.probs is None for e in plain)


# --- hostile grammars and sampling parameters ---------------------------------------------------
# Before the sampler was guarded each of these aborted or crashed the whole process (llama.cpp's
# "Unexpected empty grammar stack", a stack overflow in its grammar parser) or allocated GiBs.


@pytest.mark.model
def test_grammar_no_token_can_satisfy_raises_and_the_engine_goes_on(engine):
    from localfab.engine.grammar.limits import GrammarDeadEnd

    tokens = engine.tokenize("Hi")
    for temperature in (0.8, 0.0):
        sampling = SamplingParams(grammar="root ::= [\\x00]", temperature=temperature)
        with pytest.raises(GrammarDeadEnd, match="the grammar allows no token here"):
            engine.generate(tokens, max_tokens=4, sampling=sampling)
    assert len(engine.generate(tokens, max_tokens=2, sampling=GREEDY).tokens) == 2


@pytest.mark.model
def test_grammar_dead_end_after_a_token_stops_the_stream_with_an_error(engine):
    from localfab.engine.grammar.limits import GrammarDeadEnd

    sampling = SamplingParams(grammar='root ::= "a" [\\x00]')
    texts: list[str] = []
    with pytest.raises(GrammarDeadEnd):
        for event in engine.stream(engine.tokenize("Hi"), max_tokens=4, sampling=sampling):
            texts.append(event.text)
    assert "".join(texts) == "a"


@pytest.mark.model
def test_completed_grammar_ends_the_reply_even_with_ignore_eos(engine):
    sampling = SamplingParams(grammar='root ::= "ab"', ignore_eos=True)
    done = engine.generate(engine.tokenize("Hi"), max_tokens=8, sampling=sampling)
    assert done.text == "ab" and done.finish_reason == "stop" and done.stop_type == "eos"


@pytest.mark.model
def test_logit_bias_against_every_allowed_token_is_an_error(engine):
    from localfab.engine.grammar.limits import GrammarDeadEnd

    tokens = engine.tokenize("Hi")
    # Every token whose text starts with "z" (the grammar allows only those first).
    banned = tuple(
        (t, float("-inf")) for t in range(engine.n_vocab) if engine.token_bytes(t).startswith(b"z")
    )
    sampling = SamplingParams(grammar='root ::= "z" [a-z]*', logit_bias=banned)
    with pytest.raises(GrammarDeadEnd, match="logit_bias forbids every token"):
        engine.generate(tokens, max_tokens=2, sampling=sampling)


@pytest.mark.model
def test_grammar_past_the_limits_is_refused_before_llama_cpp(engine):
    from localfab.engine.grammar.limits import GrammarLimitError

    nested = "root ::= " + "(" * 100_000 + '"a"' + ")" * 100_000
    with pytest.raises(GrammarLimitError, match="grammar nesting depth 100000"):
        engine.generate(
            engine.tokenize("Hi"), max_tokens=2, sampling=SamplingParams(grammar=nested)
        )


@pytest.mark.model
def test_repeat_last_n_past_the_context_does_not_allocate_it(engine):
    import psutil

    proc = psutil.Process()
    before = proc.memory_info().rss
    for last_n in (2**31 - 1, -1):
        sampling = SamplingParams(repeat_last_n=last_n, repeat_penalty=1.1, temperature=0.0)
        done = engine.generate(engine.tokenize("Hi"), max_tokens=2, sampling=sampling)
        assert len(done.tokens) == 2
    # Unclamped, llama.cpp's penalty ring buffer alone is 8 GiB.
    assert proc.memory_info().rss - before < 512 * 2**20


@pytest.mark.model
def test_close_waits_for_a_generation_on_another_thread(model_path):
    """Closing under a running generation (a server worker not yet cancelled) must not free
    the context it decodes with: close waits for the lock, then frees."""
    from localfab.engine import Engine, EngineSettings

    eng = Engine(model_path, EngineSettings(n_ctx=512, n_batch=64))
    first = threading.Event()
    result: dict[str, object] = {}

    def run() -> None:
        events = eng.stream(eng.tokenize("Once upon a time"), max_tokens=24,
                            sampling=SamplingParams(temperature=0, ignore_eos=True))  # fmt: skip
        n = 0
        for _event in events:
            n += 1
            first.set()
        result["events"] = n

    thread = threading.Thread(target=run)
    thread.start()
    assert first.wait(120)
    eng.close(wait=120)  # blocks until the generation above is done
    thread.join(120)
    assert result["events"] == 25  # 24 tokens and the Done: it ran to its end, unharmed
    assert eng._ctx is None


def test_buffer_sizes_count_the_repacked_weights_apart():
    from localfab.engine.native import parse_buffer_sizes

    sizes = parse_buffer_sizes(
        [
            "load_tensors:   CPU_Mapped model buffer size =   235.16 MiB\n",
            "load_tensors:   CPU_REPACK model buffer size =    12.66 MiB\n",
            "llama_kv_cache:        CPU KV buffer size =    60.00 MiB\n",
        ]
    )
    mib = 1024 * 1024
    assert sizes.model_bytes == round(235.16 * mib) + round(12.66 * mib)
    assert sizes.repacked_bytes == round(12.66 * mib)
    assert sizes.by_device["CPU"]["KV"] == 60 * mib
    assert parse_buffer_sizes(["CPU_Mapped model buffer size = 1.00 MiB"]).repacked_bytes == 0
