#!/usr/bin/env python3
"""Write a timing-only GGUF: a larger model of the test model's family, with random weights.

Benchmarks need models of the sizes localfab is for (1B-8B), and this machine can fetch nothing
from Hugging Face. Compute time in llama.cpp depends on the shapes and types of the tensors, not
on their values, so a file with the real architecture, tokenizer and dimensions of, say, Gemma 3
1B times like the real model, while its text is noise. Use it for speed figures only.

    python scripts/synth_model.py --like gemma3:1b --out /tmp/gemma3-1b-synth-f16.gguf
    llama-quantize /tmp/gemma3-1b-synth-f16.gguf /tmp/gemma3-1b-synth-q4_k_m.gguf Q4_K_M

The tokenizer and every other key come from the source model (the test model unless --source
names another); only the dimensions below change.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

# Dimensions of real models of the Gemma 3 family (config.json of the released checkpoints).
SHAPES = {
    "gemma3:1b": {"embedding_length": 1152, "feed_forward_length": 6912, "block_count": 26},
    "gemma3:4b": {
        "embedding_length": 2560,
        "feed_forward_length": 10240,
        "block_count": 34,
        "attention.head_count": 8,
        "attention.head_count_kv": 4,
        "attention.sliding_window": 1024,
    },
}


def _source(model: str) -> Path:
    from localfab.config import default_paths
    from localfab.runtime import resolve_model

    return resolve_model(model, default_paths())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--like", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--source", default="gemma3:270m", help="a GGUF path or model name of the same family"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import gguf

    source = _source(args.source)
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    shape = SHAPES[args.like]
    if not args.like.startswith(arch):
        sys.exit(f"{source} is a {arch} model; --like {args.like} needs its own family")

    def dim(name: str) -> int:
        return int(shape.get(name, reader.fields[f"{arch}.{name}"].contents()))

    n_embd, n_ff, n_layer = dim("embedding_length"), dim("feed_forward_length"), dim("block_count")
    n_head, n_head_kv = dim("attention.head_count"), dim("attention.head_count_kv")
    head_k, head_v = dim("attention.key_length"), dim("attention.value_length")
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)

    writer = gguf.GGUFWriter(args.out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value: Any = shape.get(key.removeprefix(f"{arch}."), None)
        if key == "general.file_type":
            value = int(gguf.LlamaFileType.MOSTLY_F16)
        elif key == "general.name":
            value = f"synthetic {args.like} (random weights, timing only)"
        if value is None:
            value = field.contents()
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, main_type, sub_type)

    rng = np.random.default_rng(args.seed)

    def weight(rows: int, cols: int) -> np.ndarray:
        # numpy shape (rows, cols) is GGUF shape [cols, rows]: cols is the row length.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", norm(n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", norm(n_embd))
        writer.add_tensor(p + "attn_q.weight", weight(n_head * head_k, n_embd))
        writer.add_tensor(p + "attn_k.weight", weight(n_head_kv * head_k, n_embd))
        writer.add_tensor(p + "attn_v.weight", weight(n_head_kv * head_v, n_embd))
        writer.add_tensor(p + "attn_q_norm.weight", norm(head_k))
        writer.add_tensor(p + "attn_k_norm.weight", norm(head_k))
        writer.add_tensor(p + "attn_output.weight", weight(n_embd, n_head * head_v))
        writer.add_tensor(p + "post_attention_norm.weight", norm(n_embd))
        writer.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        writer.add_tensor(p + "ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(p + "ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(p + "ffn_down.weight", weight(n_embd, n_ff))
        writer.add_tensor(p + "post_ffw_norm.weight", norm(n_embd))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
