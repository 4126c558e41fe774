"""A tiny vision projector (mmproj) GGUF with random weights, for tests without a vision model.

It is a Gemma 3 projector as llama.cpp's `clip` loads one (projector type `gemma3`: a SigLIP
vision transformer, average pooling, an RMS norm and the projection into the text model's
embedding space), with tiny dimensions: a 64-pixel image in 8-pixel patches, pooled 2x2, gives
16 image tokens of the text model's embedding size. Everything but the model's eyes is real:
llama.cpp loads it, checks it against the text model, encodes images with it and decodes the
embeddings into the KV cache, so load, planning, encoding, caching and shifting are exercised.

Usage: python scripts/mmproj_model.py OUT.gguf [--n-embd 640] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

IMAGE_SIZE = 64
PATCH = 8
MERGE = 2  # the average pool's kernel: (64 / 8 / 2)^2 = 16 image tokens
HIDDEN = 64
FFN = 128  # not HIDDEN: clip swaps up and down when ffn_down's first dimension is the hidden size
HEADS = 2
LAYERS = 2
IMAGE_TOKENS = (IMAGE_SIZE // PATCH // MERGE) ** 2


def write_projector(out: Path, n_embd: int, seed: int = 0) -> Path:
    """Write the projector for a text model of embedding size `n_embd` to `out`."""
    import gguf

    rng = np.random.default_rng(seed)

    def rnd(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(out), arch="clip")
    writer.add_name("tiny random gemma3 projector")
    writer.add_file_type(0)  # all F32
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", HIDDEN)
    writer.add_uint32("clip.vision.feed_forward_length", FFN)
    writer.add_uint32("clip.vision.block_count", LAYERS)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projection_dim", n_embd)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_uint32("clip.vision.projector.scale_factor", MERGE)
    # numpy shapes are ggml's dimensions reversed.
    side = IMAGE_SIZE // PATCH
    tensors = {
        "v.patch_embd.weight": rnd(HIDDEN, 3, PATCH, PATCH, scale=0.1),
        "v.patch_embd.bias": rnd(HIDDEN),
        "v.position_embd.weight": rnd(side * side, HIDDEN),
    }
    for i in range(LAYERS):
        block = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{block}.{name}.weight"] = rnd(HIDDEN, HIDDEN, scale=0.1)
            tensors[f"{block}.{name}.bias"] = rnd(HIDDEN)
        for norm in ("ln1", "ln2"):
            tensors[f"{block}.{norm}.weight"] = np.ones(HIDDEN, np.float32)
            tensors[f"{block}.{norm}.bias"] = np.zeros(HIDDEN, np.float32)
        tensors[f"{block}.ffn_up.weight"] = rnd(FFN, HIDDEN, scale=0.1)
        tensors[f"{block}.ffn_up.bias"] = rnd(FFN)
        tensors[f"{block}.ffn_down.weight"] = rnd(HIDDEN, FFN, scale=0.1)
        tensors[f"{block}.ffn_down.bias"] = rnd(HIDDEN)
    tensors["v.post_ln.weight"] = np.ones(HIDDEN, np.float32)
    tensors["v.post_ln.bias"] = np.zeros(HIDDEN, np.float32)
    tensors["mm.soft_emb_norm.weight"] = np.ones(HIDDEN, np.float32)
    # Its first ggml dimension is the embedding size the text model must have.
    tensors["mm.input_projection.weight"] = rnd(HIDDEN, n_embd, scale=0.5)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--n-embd", type=int, default=640, help="the text model's (Gemma 3: 640)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_projector(args.out, args.n_embd, args.seed)
    print(f"wrote {args.out}: {IMAGE_TOKENS} image tokens of {args.n_embd} per image")


if __name__ == "__main__":
    main()
