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
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Dims:
    """The vision transformer's sizes (the defaults: the tiny one the tests use; Gemma 3's
    real projector is image_size=896, patch=14, merge=4, hidden=1152, ffn=4304, heads=16,
    layers=27)."""

    image_size: int = 64
    patch: int = 8
    merge: int = 2  # the average pool's kernel: (64 / 8 / 2)^2 = 16 image tokens
    hidden: int = 64
    # Not `hidden`: clip swaps up and down when ffn_down's first dimension is the hidden size.
    ffn: int = 128
    heads: int = 2
    layers: int = 2
    f16: bool = False  # the matrices in f16 (as real projectors ship), else f32

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch // self.merge) ** 2


TINY = Dims()
IMAGE_TOKENS = TINY.image_tokens


def write_projector(out: Path, n_embd: int, seed: int = 0, dims: Dims = TINY) -> Path:
    """Write the projector for a text model of embedding size `n_embd` to `out`."""
    import gguf

    rng = np.random.default_rng(seed)
    hidden, ffn, patch = dims.hidden, dims.ffn, dims.patch

    def rnd(*shape: int, scale: float = 0.02) -> np.ndarray:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        return values.astype(np.float16) if dims.f16 and len(shape) > 1 else values

    writer = gguf.GGUFWriter(str(out), arch="clip")
    writer.add_name("tiny random gemma3 projector")
    writer.add_file_type(1 if dims.f16 else 0)  # the matrices F16, or all F32
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", dims.image_size)
    writer.add_uint32("clip.vision.patch_size", patch)
    writer.add_uint32("clip.vision.embedding_length", hidden)
    writer.add_uint32("clip.vision.feed_forward_length", ffn)
    writer.add_uint32("clip.vision.block_count", dims.layers)
    writer.add_uint32("clip.vision.attention.head_count", dims.heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projection_dim", n_embd)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_uint32("clip.vision.projector.scale_factor", dims.merge)
    # numpy shapes are ggml's dimensions reversed.
    side = dims.image_size // patch
    tensors = {
        "v.patch_embd.weight": rnd(hidden, 3, patch, patch, scale=0.1),
        "v.patch_embd.bias": rnd(hidden),
        "v.position_embd.weight": rnd(side * side, hidden),
    }
    for i in range(dims.layers):
        block = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{block}.{name}.weight"] = rnd(hidden, hidden, scale=0.1)
            tensors[f"{block}.{name}.bias"] = rnd(hidden)
        for norm in ("ln1", "ln2"):
            tensors[f"{block}.{norm}.weight"] = np.ones(hidden, np.float32)
            tensors[f"{block}.{norm}.bias"] = np.zeros(hidden, np.float32)
        tensors[f"{block}.ffn_up.weight"] = rnd(ffn, hidden, scale=0.1)
        tensors[f"{block}.ffn_up.bias"] = rnd(ffn)
        tensors[f"{block}.ffn_down.weight"] = rnd(hidden, ffn, scale=0.1)
        tensors[f"{block}.ffn_down.bias"] = rnd(hidden)
    tensors["v.post_ln.weight"] = np.ones(hidden, np.float32)
    tensors["v.post_ln.bias"] = np.zeros(hidden, np.float32)
    tensors["mm.soft_emb_norm.weight"] = np.ones(hidden, np.float32)
    # Its first ggml dimension is the embedding size the text model must have.
    tensors["mm.input_projection.weight"] = rnd(hidden, n_embd, scale=0.5)
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
