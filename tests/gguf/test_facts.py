"""GGUF facts: the header reader against llama.cpp, remote-style reads, broken files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from localfab.errors import ModelError
from localfab.gguf.facts import FileSource, ModelFacts, RangeSource, read_facts
from localfab.machine.probes import load_model_specs
from tests.gguf_fixtures import SparseSource, build_header, synthetic_source, write_sparse

SPECS = load_model_specs()


@pytest.fixture(scope="module")
def facts(model_path: Path) -> ModelFacts:
    return read_facts(model_path)


class CountingSource(FileSource):
    """A FileSource that records every range asked for, like an HTTP ranged reader would."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads: list[tuple[int, int]] = []

    def read(self, offset: int, size: int) -> bytes:
        self.reads.append((offset, size))
        return super().read(offset, size)


# --- the real test model ---------------------------------------------------------------------


@pytest.mark.model
def test_header_facts_match_llama_cpp_metadata(model_path: Path, facts: ModelFacts) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    try:
        theirs = dict(llm.metadata)
        n_vocab = llm.n_vocab()  # vocab_only loads the vocabulary, not the hyperparameters
    finally:
        llm.close()
    assert theirs, "llama.cpp reported no metadata"
    for key, text in theirs.items():
        ours = facts.metadata[key]
        if isinstance(ours, bool):
            assert text == str(ours).lower(), key
        elif isinstance(ours, float):
            assert float(text) == pytest.approx(ours, rel=1e-5, abs=1e-6), key
        else:
            assert text == str(ours), key
    arch = theirs["general.architecture"]
    assert facts.arch == arch == "gemma3"
    assert facts.n_layer == int(theirs[f"{arch}.block_count"]) == 18
    assert facts.n_embd == int(theirs[f"{arch}.embedding_length"]) == 640
    assert facts.n_head == int(theirs[f"{arch}.attention.head_count"])
    assert facts.n_head_kv == int(theirs[f"{arch}.attention.head_count_kv"])
    assert facts.key_length == facts.value_length == 256
    assert facts.sliding_window == int(theirs[f"{arch}.attention.sliding_window"]) == 512
    assert facts.n_ctx_train == int(theirs[f"{arch}.context_length"]) == 32768
    assert facts.n_vocab == n_vocab == 262144
    assert facts.bos_token_id == int(theirs["tokenizer.ggml.bos_token_id"])
    assert facts.eos_token_id == int(theirs["tokenizer.ggml.eos_token_id"])
    assert facts.file_type_name == "MOSTLY_Q4_K_M"
    assert facts.chat_template is None  # a base model: no template in its metadata
    # llama.cpp logs "is_swa = 0" for layers 5, 11, 17 (set_swa_pattern(6))
    assert [il for il in range(18) if not facts.is_swa(il)] == [5, 11, 17]


@pytest.mark.model
def test_tensor_bytes_match_the_gguf_package(model_path: Path, facts: ModelFacts) -> None:
    from gguf import GGUFReader

    reader = GGUFReader(model_path)
    theirs = {t.name: (int(t.n_bytes), int(t.data_offset)) for t in reader.tensors}
    assert len(facts.tensors) == len(theirs) == 236
    for t in facts.tensors:
        assert (t.nbytes, facts.tensor_data_offset + t.offset) == theirs[t.name], t.name
    assert facts.total_tensor_bytes == sum(n for n, _ in theirs.values())
    assert facts.file_size == model_path.stat().st_size
    assert facts.output_tied and facts.output_bytes == 0
    assert (
        facts.token_embd_bytes + sum(facts.layer_bytes) + facts.output_norm_bytes
        == facts.total_tensor_bytes
    )


@pytest.mark.model
def test_ranged_reads_fetch_only_the_header(model_path: Path, facts: ModelFacts) -> None:
    source = CountingSource(model_path)
    assert isinstance(source, RangeSource)
    remote = read_facts(source)
    assert remote == facts
    fetched = sum(size for _, size in source.reads)
    # the header is ~6.5 MB (262k token strings); reads are few and stop near the data start
    assert len(source.reads) <= 8
    assert max(off for off, _ in source.reads) < facts.tensor_data_offset
    assert fetched < 2 * facts.tensor_data_offset < facts.file_size / 10


# --- broken files ------------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("cut", [3, 20, 1_000_000, "infos", "data"])
def test_truncated_file_fails_cleanly(
    model_path: Path, facts: ModelFacts, tmp_path: Path, cut: int | str
) -> None:
    if cut == "infos":
        cut = facts.tensor_data_offset - 100
    elif cut == "data":
        cut = facts.tensor_data_offset + 100_000_000
    assert isinstance(cut, int)
    broken = tmp_path / "broken.gguf"
    with model_path.open("rb") as src:
        broken.write_bytes(src.read(cut))
    with pytest.raises(ModelError) as info:
        read_facts(broken)
    message = str(info.value)
    assert str(broken) in message
    if cut < 4:
        assert "not a GGUF file" in message
    elif cut > facts.tensor_data_offset:
        assert "truncated" in message and "download it again" in message
    else:
        assert f"truncated at byte {cut}" in message and "download it again" in message


def _tiny(metadata: dict | None = None) -> tuple[bytes, int]:
    meta = {
        "general.architecture": "llama",
        "llama.block_count": 1,
        "llama.embedding_length": 256,
        "llama.attention.head_count": 2,
    }
    meta.update(metadata or {})
    return build_header(meta, [("blk.0.attn_q.weight", [256, 256], 0)])


def test_corrupt_value_type_names_the_offset(tmp_path: Path) -> None:
    header, total = _tiny()
    key = b"llama.block_count"
    at = header.index(key) + len(key)  # the value type follows the key
    bad = header[:at] + struct.pack("<I", 99) + header[at + 4 :]
    with pytest.raises(ModelError, match=rf"corrupt GGUF header at byte {at - 0}.*value type 99"):
        read_facts(write_sparse(tmp_path / "bad.gguf", bad, total))


def test_corrupt_string_length_fails_cleanly(tmp_path: Path) -> None:
    header, total = _tiny()
    at = 24  # the first key's length
    bad = header[:at] + struct.pack("<Q", 2**60) + header[at + 8 :]
    with pytest.raises(ModelError, match=r"corrupt GGUF header at byte 24.*impossible"):
        read_facts(write_sparse(tmp_path / "bad.gguf", bad, total))


def test_unknown_tensor_type_fails_cleanly() -> None:
    meta = {"general.architecture": "llama", "llama.block_count": 1}
    header, total = build_header(meta, [("x", [32], 0)])
    at = header.index(b"x") + 1 + 4 + 8  # name, n_dims, one dim -> the type
    bad = header[:at] + struct.pack("<I", 1234) + header[at + 4 :]
    with pytest.raises(ModelError, match="unknown ggml type 1234"):
        read_facts(SparseSource(bad, total))


def test_not_gguf_and_missing_files(tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("hello, this is not a model\n")
    with pytest.raises(ModelError, match="not a GGUF file"):
        read_facts(text)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match="not a GGUF file"):
        read_facts(empty)
    with pytest.raises(ModelError, match="does not exist"):
        read_facts(tmp_path / "nope.gguf")
    with pytest.raises(ModelError, match="folder"):
        read_facts(tmp_path)
    old = b"GGUF" + struct.pack("<I", 1) + b"\0" * 64
    with pytest.raises(ModelError, match="version 1 is not supported"):
        read_facts(SparseSource(old, len(old)))


def test_header_without_architecture_is_rejected() -> None:
    header, total = build_header({"general.name": "x"}, [])
    with pytest.raises(ModelError, match="general.architecture"):
        read_facts(SparseSource(header, total))


# --- synthetic models --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_synthetic_models_read_back(name: str) -> None:
    spec = SPECS[name]
    source = synthetic_source(spec, name=name)
    f = read_facts(source)
    assert (f.arch, f.n_layer, f.n_embd) == (spec["arch"], spec["n_layer"], spec["n_embd"])
    assert (f.n_head, f.n_head_kv, f.key_length) == (
        spec["n_head"],
        spec["n_head_kv"],
        spec["head_dim"],
    )
    assert (f.n_vocab, f.n_ctx_train, f.n_ff) == (
        spec["n_vocab"],
        spec["n_ctx_train"],
        spec["n_ff"],
    )
    assert f.total_tensor_bytes == pytest.approx(spec["q4_k_m_bytes"], rel=0.03)
    assert f.file_size == source.size()
    assert f.chat_template is not None and f.file_type_name == "MOSTLY_Q4_K_M"
    if spec.get("sliding_window"):
        # "5 local layers then 1 global": llama.cpp's default pattern for gemma3
        assert f.swa_layers == tuple(il % 6 != 5 for il in range(spec["n_layer"]))
    else:
        assert not any(f.swa_layers)
    # the vocabulary strings are skipped, never all fetched one by one
    assert len(source.reads) <= 6


def test_sliding_window_pattern_metadata_wins() -> None:
    spec = dict(SPECS["gemma-3-270m (the test model)"])
    base = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 4,
        "gemma3.embedding_length": 64,
        "gemma3.attention.head_count": 2,
        "gemma3.attention.sliding_window": 128,
    }
    as_array = read_facts(
        SparseSource(
            *build_header(
                base | {"gemma3.attention.sliding_window_pattern": [True, False, False, True]}, []
            )
        )
    )
    assert as_array.swa_layers == (True, False, False, True)
    as_period = read_facts(
        SparseSource(*build_header(base | {"gemma3.attention.sliding_window_pattern": 2}, []))
    )
    assert as_period.swa_layers == (True, False, True, False)
    default = read_facts(SparseSource(*build_header(base, [])))
    assert default.swa_layers == (True, True, True, True)  # period 6: layer 5 would be global
    assert spec["sliding_window"] == 512


def test_per_layer_kv_heads() -> None:
    meta = {
        "general.architecture": "openelm",
        "openelm.block_count": 3,
        "openelm.embedding_length": 128,
        "openelm.attention.head_count": [4, 4, 8],
        "openelm.attention.head_count_kv": [2, 2, 2],
    }
    f = read_facts(SparseSource(*build_header(meta, [])))
    assert f.n_head == (4, 4, 8)
    assert f.n_head_kv == 2  # equal per-layer values collapse to one number
    assert f.heads(2) == 8 and f.head_kv(1) == 2
    assert f.to_dict()["n_head"] == [4, 4, 8]
