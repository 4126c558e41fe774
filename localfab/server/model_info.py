"""Facts about the loaded model that /props and /v1/models show, read once after loading."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localfab.runtime import LoadedModel
    from localfab.server.settings import ServerSettings

log = logging.getLogger("localfab.server")


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model, read once after loading."""

    name: str
    path: str
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_params: int
    size: int
    vocab_type: int
    ftype: str
    bos_token: str
    eos_token: str
    chat_template: str
    vision: bool = False  # a projector is attached: prompts may hold images


_VOCAB_TYPES = {"llama": 1, "gpt2": 2, "bert": 3, "t5": 4, "rwkv": 5, "plamo2": 6}


def model_info(model: LoadedModel, settings: ServerSettings) -> ModelInfo:
    engine = model.engine
    meta = engine.metadata()
    arch = meta.get("general.architecture", "")
    n_params = size = 0
    ftype = ""
    try:
        from localfab.gguf.facts import read_facts

        facts = read_facts(model.path)
        for tensor in facts.tensors:
            count = 1
            for dim in tensor.shape:
                count *= dim
            n_params += count
            size += tensor.nbytes
        ftype = facts.file_type_name or ""
    except Exception as exc:  # facts are cosmetic here; never block serving on them
        log.warning("could not read model facts: %s", exc)
    return ModelInfo(
        name=settings.public_model_name or str(model.path),
        path=str(model.path),
        n_ctx=engine.n_ctx,
        n_ctx_train=engine.n_ctx_train,
        n_vocab=engine.n_vocab,
        n_embd=int(meta.get(f"{arch}.embedding_length", "0") or 0),
        n_params=n_params,
        size=size,
        vocab_type=_VOCAB_TYPES.get(meta.get("tokenizer.ggml.model", ""), 0),
        ftype=ftype,
        bos_token=engine.token_text(engine.bos_token),
        eos_token=engine.token_text(engine.eos_token),
        chat_template=model.prompts.template.source,
        vision=engine.projector is not None,
    )
