"""Slot files (llama.cpp's sequence state files) written and read without llama.cpp opening them:
byte for byte llama.cpp's own, and a file cut short is refused instead of aborting the process."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from localfab.engine import Engine, EngineSettings, GenerationOptions, SamplingParams
from localfab.engine.seq_file import BadSeqFile, missing_bytes, parse_head

GREEDY = GenerationOptions(max_tokens=12, sampling=SamplingParams.greedy())
TEXT = "The lighthouse keeper climbed the spiral stairs every evening to light the lamp. " * 3

# Each layout of the KV state: the defaults, a quantized cache, values transposed (flash
# attention off), a sliding-window cache of window size, and a second sequence of two.
LOADS = {
    "default": EngineSettings(n_ctx=1024),
    "q8_0 cache": EngineSettings(n_ctx=1024, type_k="q8_0", type_v="q8_0", flash_attn="on"),
    "flash attention off": EngineSettings(n_ctx=1024, flash_attn="off"),
    "sliding window": EngineSettings(n_ctx=1024, swa_full=False),
    "two sequences": EngineSettings(n_ctx=2048, n_seq_max=2),
}


def llama_cpp_file(engine: Engine, path: Path) -> bytes:
    """What llama.cpp's own writer (llama-server's slot save) writes for the engine's sequence."""
    import llama_cpp as lc

    kv = engine.kv
    tokens = (lc.llama_token * len(kv.cached))(*kv.cached)
    n = lc.llama_state_seq_save_file(kv.ctx, str(path).encode(), kv.seq, tokens, len(kv.cached))
    assert n > 0
    return path.read_bytes()


@pytest.mark.parametrize("load", LOADS, ids=list(LOADS))
def test_a_saved_file_is_llama_cpps_and_every_cut_is_refused_not_an_abort(
    model_path: Path, tmp_path: Path, load: str
) -> None:
    with Engine(model_path, LOADS[load]) as engine:
        prompt = engine.tokenize(TEXT)
        engine.evaluate(prompt)
        out = io.BytesIO()
        n_written = engine.kv.save_file(out)
        saved = out.getvalue()
        assert n_written == len(saved)
        assert saved == llama_cpp_file(engine, tmp_path / "native.bin")
        live = engine.generate(prompt, GREEDY).tokens
        head = parse_head(saved, capacity=engine.kv.n_ctx)
        assert list(head.tokens) == prompt
        assert missing_bytes(saved[head.state_offset :]) == 0
        for cut in (1, 2, 3, 64, 1000, len(saved) // 2, len(saved) - head.state_offset - 4):
            with pytest.raises(BadSeqFile) as refused:
                engine.kv.load_file(bytearray(saved[:-cut]))
            assert refused.value.cut_short and "cut short" in str(refused.value), cut
            assert engine.kv.cached == []  # the sequence is empty, the engine goes on
        with pytest.raises(BadSeqFile) as in_tokens:
            engine.kv.load_file(bytearray(saved[: head.state_offset - 3]))
        assert in_tokens.value.cut_short
        # The whole file (llama.cpp's) restores the prompt: the reply is the live one.
        assert engine.kv.load_file(bytearray(saved)) == len(saved)
        assert engine.kv.cached == prompt
        assert engine.generate(prompt, GREEDY).tokens == live


def test_files_that_are_not_slot_files_are_refused_with_why(engine: Engine) -> None:
    cases = {
        b"": "shorter than its header",
        b"not a slot file at all" * 10: "not a slot save file",
        b"qsgg\x02\x00\x00\x00\x00\x00\x00\x00": "format version 2",
        b"qsgg\x03\x00\x00\x00\xff\xff\xff\x00" + b"\0" * 64: "cut short",
    }
    for raw, why in cases.items():
        with pytest.raises(BadSeqFile, match=why):
            engine.kv.load_file(bytearray(raw))
    big = bytearray(b"qsgg\x03\x00\x00\x00") + (5000).to_bytes(4, "little") + bytes(4 * 5000)
    with pytest.raises(BadSeqFile, match="does not fit"):
        engine.kv.load_file(big)
