"""Header-only GGUF files for planner and facts tests.

`build_header` writes a real GGUF header (the same layout llama.cpp reads) for any metadata and
tensor list; `synthetic_model` builds the tensor list of a Q4_K_M model from an entry of
`localfab/data/models.json` (the quant mix follows llama.cpp's Q4_K_M rules closely enough that
the totals land within a few percent of the published file sizes). The tensor data is never
written: files are sparse (the header, then a hole up to the full size), and `SparseSource`
serves the same bytes from memory through the `RangeSource` protocol.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

Q = GGMLQuantizationType
ALIGN = 32


@dataclass(frozen=True)
class Typed:
    """A metadata value with an explicit GGUF value type."""

    vtype: GGUFValueType
    value: Any
    item_type: GGUFValueType | None = None  # for arrays


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


_FMT = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


def _infer(value: Any) -> Typed:
    if isinstance(value, Typed):
        return value
    if isinstance(value, bool):
        return Typed(GGUFValueType.BOOL, value)
    if isinstance(value, int):
        return Typed(GGUFValueType.UINT32 if 0 <= value < 2**32 else GGUFValueType.INT64, value)
    if isinstance(value, float):
        return Typed(GGUFValueType.FLOAT32, value)
    if isinstance(value, str):
        return Typed(GGUFValueType.STRING, value)
    if isinstance(value, list | tuple):
        first = value[0] if value else ""
        item = _infer(first).vtype
        if item == GGUFValueType.UINT32 and any(v < 0 for v in value):
            item = GGUFValueType.INT32
        return Typed(GGUFValueType.ARRAY, list(value), item)
    raise TypeError(f"cannot encode {value!r}")


def _encode_value(t: Typed) -> bytes:
    if t.vtype == GGUFValueType.STRING:
        return _string(t.value)
    if t.vtype == GGUFValueType.ARRAY:
        assert t.item_type is not None
        out = [struct.pack("<IQ", t.item_type, len(t.value))]
        if t.item_type == GGUFValueType.STRING:
            out += [_string(v) for v in t.value]
        else:
            fmt = _FMT[t.item_type][1]
            out.append(struct.pack(f"<{len(t.value)}{fmt}", *t.value))
        return b"".join(out)
    return struct.pack(_FMT[t.vtype], t.value)


def tensor_nbytes(shape: Sequence[int], ggml_type: int) -> int:
    block, size = GGML_QUANT_SIZES[Q(ggml_type)]
    n = shape[0] // block * size
    for d in shape[1:]:
        n *= d
    return n


def build_header(
    metadata: Mapping[str, Any],
    tensors: Sequence[tuple[str, Sequence[int], int]],
    *,
    version: int = 3,
) -> tuple[bytes, int]:
    """GGUF header bytes (padded to the data start) and the full file size."""
    parts = [b"GGUF", struct.pack("<IQQ", version, len(tensors), len(metadata))]
    for key, value in metadata.items():
        t = _infer(value)
        parts += [_string(key), struct.pack("<I", t.vtype), _encode_value(t)]
    offset = 0
    for name, shape, ggml_type in tensors:
        parts += [_string(name), struct.pack("<I", len(shape))]
        parts += [struct.pack("<Q", d) for d in shape]
        parts.append(struct.pack("<IQ", ggml_type, offset))
        offset += tensor_nbytes(shape, ggml_type)
        offset = -(-offset // ALIGN) * ALIGN
    header = b"".join(parts)
    header += b"\0" * (-len(header) % ALIGN)
    return header, len(header) + offset


class SparseSource:
    """A RangeSource over a header followed by zeros up to `total` bytes."""

    def __init__(self, header: bytes, total: int, label: str = "synthetic.gguf") -> None:
        self.header = header
        self.total = total
        self.label = label
        self.reads: list[tuple[int, int]] = []

    def read(self, offset: int, size: int) -> bytes:
        self.reads.append((offset, size))
        end = min(offset + size, self.total)
        if offset >= end:
            return b""
        head = self.header[offset:end]
        return head + b"\0" * (end - offset - len(head))

    def size(self) -> int | None:
        return self.total


def write_sparse(path: Path, header: bytes, total: int) -> Path:
    """Write the header and extend the file to its full size without writing the data."""
    with path.open("wb") as f:
        f.write(header)
        f.truncate(total)
    return path


# --- synthetic Q4_K_M models from models.json ------------------------------------------------


def _use_more_bits(il: int, n: int) -> bool:
    # llama.cpp llama-quant.cpp: Q4_K_M gives attn_v / ffn_down Q6_K in these layers
    return il < n // 8 or il >= 7 * n // 8 or (il - n // 8) % 3 == 2


def _q(kind: int, ne0: int) -> int:
    """Fall back to 32-blocks when a row is not a multiple of 256 (as llama.cpp does)."""
    if GGML_QUANT_SIZES[Q(kind)][0] == 256 and ne0 % 256:
        return int(Q.Q5_0 if kind == Q.Q4_K else Q.Q8_0)
    return int(kind)


def synthetic_model(spec: Mapping[str, Any], *, name: str = "synthetic") -> tuple[dict, list]:
    """Metadata and tensor list of a Q4_K_M model with the architecture in `spec`.

    models.json does not say whether a model ties its output layer to the token embedding
    (Gemma and Llama 3.2 do); the variant whose size is closer to `q4_k_m_bytes` is used.
    """
    untied = _synthetic_model(spec, name=name, tied=False)
    tied = _synthetic_model(spec, name=name, tied=True)
    want = spec.get("q4_k_m_bytes")
    if want is None:
        return tied if spec["arch"].startswith("gemma") else untied
    size = {id(m): sum(tensor_nbytes(s, t) for _, s, t in m[1]) for m in (untied, tied)}
    return min((untied, tied), key=lambda m: abs(size[id(m)] - want))


def _synthetic_model(spec: Mapping[str, Any], *, name: str, tied: bool) -> tuple[dict, list]:
    arch = spec["arch"]
    n_layer, n_embd = spec["n_layer"], spec["n_embd"]
    n_head, n_kv, hd = spec["n_head"], spec["n_head_kv"], spec["head_dim"]
    n_ff, n_vocab = spec["n_ff"], spec["n_vocab"]
    gemma = arch.startswith("gemma")
    meta: dict[str, Any] = {
        "general.architecture": arch,
        "general.name": name,
        "general.file_type": 15,
        "general.quantization_version": 2,
        f"{arch}.block_count": n_layer,
        f"{arch}.context_length": spec["n_ctx_train"],
        f"{arch}.embedding_length": n_embd,
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_kv,
        f"{arch}.attention.key_length": hd,
        f"{arch}.attention.value_length": hd,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.rope.freq_base": 1000000.0,
    }
    if spec.get("sliding_window"):
        meta[f"{arch}.attention.sliding_window"] = spec["sliding_window"]
    meta["tokenizer.ggml.model"] = "llama" if gemma else "gpt2"
    meta["tokenizer.ggml.tokens"] = [f"t{i}" for i in range(n_vocab)]
    meta["tokenizer.ggml.bos_token_id"] = 2 if gemma else 1
    meta["tokenizer.ggml.eos_token_id"] = 1 if gemma else 2
    meta["tokenizer.chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

    f32 = int(Q.F32)
    tensors: list[tuple[str, list[int], int]] = [
        ("token_embd.weight", [n_embd, n_vocab], _q(Q.Q6_K if tied else Q.Q4_K, n_embd)),
        ("output_norm.weight", [n_embd], f32),
    ]
    if not tied:
        tensors.append(("output.weight", [n_embd, n_vocab], _q(Q.Q6_K, n_embd)))
    for il in range(n_layer):
        more = _use_more_bits(il, n_layer)
        p = f"blk.{il}."
        tensors += [
            (p + "attn_norm.weight", [n_embd], f32),
            (p + "attn_q.weight", [n_embd, n_head * hd], _q(Q.Q4_K, n_embd)),
            (p + "attn_k.weight", [n_embd, n_kv * hd], _q(Q.Q4_K, n_embd)),
            (p + "attn_v.weight", [n_embd, n_kv * hd], _q(Q.Q6_K if more else Q.Q4_K, n_embd)),
            (p + "attn_output.weight", [n_head * hd, n_embd], _q(Q.Q4_K, n_head * hd)),
            (p + "ffn_norm.weight", [n_embd], f32),
            (p + "ffn_gate.weight", [n_embd, n_ff], _q(Q.Q4_K, n_embd)),
            (p + "ffn_up.weight", [n_embd, n_ff], _q(Q.Q4_K, n_embd)),
            (p + "ffn_down.weight", [n_ff, n_embd], _q(Q.Q6_K if more else Q.Q4_K, n_ff)),
        ]
        if arch == "qwen2":
            tensors += [
                (p + "attn_q.bias", [n_head * hd], f32),
                (p + "attn_k.bias", [n_kv * hd], f32),
                (p + "attn_v.bias", [n_kv * hd], f32),
            ]
        if arch in ("qwen3", "gemma3"):
            tensors += [
                (p + "attn_q_norm.weight", [hd], f32),
                (p + "attn_k_norm.weight", [hd], f32),
            ]
        if gemma:
            tensors += [
                (p + "post_attention_norm.weight", [n_embd], f32),
                (p + "post_ffw_norm.weight", [n_embd], f32),
            ]
    return meta, tensors


def synthetic_source(spec: Mapping[str, Any], *, name: str = "synthetic") -> SparseSource:
    meta, tensors = synthetic_model(spec, name=name)
    header, total = build_header(meta, tensors)
    return SparseSource(header, total, label=f"{name}.gguf")


def write_synthetic(path: Path, spec: Mapping[str, Any], *, name: str = "synthetic") -> Path:
    meta, tensors = synthetic_model(spec, name=name)
    header, total = build_header(meta, tensors)
    return write_sparse(path, header, total)
