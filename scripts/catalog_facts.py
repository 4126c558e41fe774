#!/usr/bin/env python3
"""Write `models/catalog_facts.json`: the header facts of every catalog model, for offline fits.

Online, each entry's GGUF header is read on the hub (only the header, by ranged requests, as
`localfab plan OWNER/REPO` does; `HF_ENDPOINT` and `HF_TOKEN` apply) and summarised
(`localfab.gguf.summary`): hyperparameters and the tensor table, a few kB a model. Such an
entry says `"source": "header"`.

With `--from-configs`, a model whose header cannot be read gets facts built from its published
architecture (CONFIGS below, from each model's config.json) and llama.cpp's Q4_K_M type mix,
sized to the catalog's file size (the same synthetic header the planner tests use); such an
entry says `"source": "config"`, and the planner says its verdict is approximate. Run it online
again to replace them with the files' own headers.

Usage:
    python scripts/catalog_facts.py                  # every entry, from the hub
    python scripts/catalog_facts.py --from-configs   # ... and published configs where offline
    python scripts/catalog_facts.py --only qwen2.5:7b --out /tmp/facts.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from localfab.errors import LocalfabError  # noqa: E402
from localfab.gguf.facts import read_facts  # noqa: E402
from localfab.gguf.summary import summarize  # noqa: E402
from localfab.store.catalog import CatalogEntry, load_catalog  # noqa: E402

OUT = ROOT / "models" / "catalog_facts.json"

# Published architectures (config.json of each released checkpoint).
_FIELDS = ("arch", "n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab")


def _config(*values: Any, ctx: int, swa: int | None = None) -> dict[str, Any]:
    spec = dict(zip(_FIELDS, values, strict=True)) | {"n_ctx_train": ctx}
    return spec | ({"sliding_window": swa} if swa else {})


_QWEN_7B = _config("qwen2", 28, 3584, 28, 4, 128, 18944, 152064, ctx=32768)
CONFIGS: dict[str, dict[str, Any]] = {
    # name:              arch, layers, width, heads, KV heads, head, feed-forward, vocabulary
    "qwen2.5:0.5b": _config("qwen2", 24, 896, 14, 2, 64, 4864, 151936, ctx=32768),
    "qwen2.5:1.5b": _config("qwen2", 28, 1536, 12, 2, 128, 8960, 151936, ctx=32768),
    "qwen2.5:3b": _config("qwen2", 36, 2048, 16, 2, 128, 11008, 151936, ctx=32768),
    "qwen2.5:7b": _QWEN_7B,
    "qwen2.5-coder:7b": _QWEN_7B,
    "qwen2.5:14b": _config("qwen2", 48, 5120, 40, 8, 128, 13824, 152064, ctx=32768),
    "deepseek-r1:7b": _QWEN_7B | {"n_ctx_train": 131072},
    "qwen3:4b": _config("qwen3", 36, 2560, 32, 8, 128, 9728, 151936, ctx=40960),
    "qwen3:8b": _config("qwen3", 36, 4096, 32, 8, 128, 12288, 151936, ctx=40960),
    "llama3.2:1b": _config("llama", 16, 2048, 32, 8, 64, 8192, 128256, ctx=131072),
    "llama3.2:3b": _config("llama", 28, 3072, 24, 8, 128, 8192, 128256, ctx=131072),
    "llama3.1:8b": _config("llama", 32, 4096, 32, 8, 128, 14336, 128256, ctx=131072),
    "mistral:7b": _config("llama", 32, 4096, 32, 8, 128, 14336, 32768, ctx=32768),
    "mistral-nemo:12b": _config("llama", 40, 5120, 32, 8, 128, 14336, 131072, ctx=1024000),
    "smollm2:1.7b": _config("llama", 24, 2048, 32, 32, 64, 8192, 49152, ctx=8192),
    "smolvlm2:2.2b": _config("llama", 24, 2048, 32, 32, 64, 8192, 49280, ctx=8192),
    "gemma2:2b": _config("gemma2", 26, 2304, 8, 4, 256, 9216, 256000, ctx=8192, swa=4096),
    "gemma3:1b": _config("gemma3", 26, 1152, 4, 1, 256, 6912, 262144, ctx=32768, swa=512),
    "gemma3:4b": _config("gemma3", 34, 2560, 8, 4, 256, 10240, 262144, ctx=131072, swa=1024),
    "gemma3:12b": _config("gemma3", 48, 3840, 16, 8, 256, 15360, 262144, ctx=131072, swa=1024),
    "phi3.5:3.8b": _config("phi3", 32, 3072, 32, 32, 96, 8192, 32064, ctx=131072),
    "phi4-mini:3.8b": _config("phi3", 32, 3072, 24, 8, 128, 8192, 200064, ctx=131072),
    "phi4:14b": _config("phi3", 40, 5120, 40, 10, 128, 17920, 100352, ctx=16384),
}


def from_hub(entry: CatalogEntry) -> dict[str, Any]:
    """The summary of the entry's real header, read on the hub."""
    from localfab.hub import open_remote

    remote = open_remote(entry.name)
    return summarize(read_facts(remote.sources[0]), source="header")


def from_config(entry: CatalogEntry) -> dict[str, Any]:
    """The summary of a synthetic Q4_K_M header with the entry's published architecture."""
    from tests.gguf_fixtures import synthetic_source

    spec = CONFIGS[entry.name] | {"q4_k_m_bytes": entry.size_bytes}
    facts = read_facts(synthetic_source(spec, name=entry.title))
    return summarize(facts, source="config")


def build(
    entries: list[CatalogEntry], *, configs: bool, say: Any = print
) -> dict[str, dict[str, Any]]:
    """Summaries by catalog name: from the hub, else (with `configs`) from published configs."""
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        try:
            out[entry.name] = from_hub(entry)
            say(f"{entry.name}: header read on the hub")
        except LocalfabError as exc:
            if not configs or entry.name not in CONFIGS:
                raise
            out[entry.name] = from_config(entry)
            say(f"{entry.name}: from its published config ({str(exc)[:60]}...)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="Only this catalog name (repeatable).")
    parser.add_argument("--from-configs", action="store_true", help="Use CONFIGS where offline.")
    parser.add_argument("--out", type=Path, default=OUT, help=f"Where to write ({OUT}).")
    args = parser.parse_args(argv)
    entries = [e for e in load_catalog() if not args.only or e.name in args.only]
    models = build(entries, configs=args.from_configs)
    document = {
        "_about": "Header facts of the catalog's models (localfab.gguf.summary), for fits "
        "before download without the network. Written by scripts/catalog_facts.py; 'source' "
        "says whether each came from the file's header or from its published config.",
        "models": dict(sorted(models.items())),
    }
    args.out.write_text(json.dumps(document, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(models)} models)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
