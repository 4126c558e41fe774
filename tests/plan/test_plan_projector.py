"""A vision projector planned beside its model (GPU, CPU, or nowhere), what an image costs, and
the plan's projector memory against what llama.cpp reports when it loads one."""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab.gguf.projector import ProjectorFacts, read_projector
from localfab.machine.probes import GiB, MiB, machine_from_profile_name
from localfab.plan import Wishes, plan
from localfab.plan.projector import gpu_need, plan_projector, plan_together, projector_compute
from tests.engine.test_vision import MMPROJ
from tests.plan.test_plan import cpu_machine, synthetic

# Gemma 3 4B's projector (mmproj-model-f16.gguf, 851 MiB): SigLIP at 896 px in 14 px patches,
# pooled 4x4 into 256 tokens of the text model's 2560.
GEMMA3_4B = ProjectorFacts(
    label="mmproj-model-f16.gguf",
    projector_type="gemma3",
    vision=True,
    image_size=896,
    patch_size=14,
    n_embd=1152,
    n_ff=4304,
    n_head=16,
    n_layer=27,
    merge=4,
    projection_dim=2560,
    weights=851 * MiB,
)
# The 6 GB card without the context the planner would fill it with: room is left beside.
SMALL_CTX = Wishes(n_ctx=8192)


def test_the_projector_goes_on_the_gpu_beside_the_model_where_there_is_room() -> None:
    machine = machine_from_profile_name("rtx3060-laptop-6gb")
    target = plan(synthetic("gemma-3-4b-it"), machine, SMALL_CTX)
    placed = plan_projector(target, GEMMA3_4B, machine, name="mmproj-model-f16.gguf")
    assert placed.fits and placed.use_gpu and placed.device == target.gpu
    assert placed.weights == 851 * MiB
    # The feed-forward phase of 4096 patches: what llama.cpp reserves for this projector.
    assert placed.compute == pytest.approx(121.25 * MiB, rel=0.01)
    assert placed.total <= placed.room
    assert placed.image_tokens == 256 and placed.image_kv and placed.image_kv > 0
    line = placed.describe()
    assert "851 MiB weights + 121 MiB compute on the GPU" in line
    assert placed.image_cost().startswith("an image takes 256 tokens of the context (")


def test_without_offload_or_room_it_goes_on_the_cpu_and_says_why() -> None:
    machine = machine_from_profile_name("rtx3060-laptop-6gb")
    target = plan(synthetic("gemma-3-4b-it"), machine, SMALL_CTX)
    kept = plan_projector(target, GEMMA3_4B, machine, name="p", offload=False)
    assert kept.fits and kept.device == "CPU" and "--no-mmproj-offload" in kept.reason
    full = plan(synthetic("Llama-3.1-8B-Instruct"), machine)  # fills the card
    moved = plan_projector(full, GEMMA3_4B, machine, name="p")
    assert moved.fits and moved.device == "CPU"
    assert "the GPU has" in moved.reason and "left beside the model" in moved.reason


def test_the_projectors_room_on_the_gpu_is_kept_before_the_model_fills_it() -> None:
    """On a 6 GB card the planner fills what the model leaves with context; planned together,
    the projector's room is kept first and the model gets the rest (as Ollama does)."""
    machine = machine_from_profile_name("rtx2060-6gb")
    model = synthetic("gemma-3-4b-it")
    alone = plan(model, machine, Wishes())
    assert plan_projector(alone, GEMMA3_4B, machine, name="p").device == "CPU"  # 74 MiB left
    together, placed = plan_together(model, alone, GEMMA3_4B, machine, Wishes(), name="p")
    assert placed.fits and placed.use_gpu and placed.device == alone.gpu
    assert together.fits and together.n_gpu_layers == alone.n_gpu_layers  # all layers still
    # A quantized KV cache gave the room (the planner's choice before a smaller context).
    assert (together.n_ctx, together.type_k) == (alone.n_ctx, "q8_0") and alone.type_k == "f16"
    gpu = together.device_memory(together.gpu)
    assert gpu is not None and gpu.free_left >= 0  # the model in what the projector leaves
    assert placed.total <= placed.room == gpu.free_left + gpu_need(GEMMA3_4B)
    assert "kept before the model was planned (KV cache q8_0/q8_0 instead of f16/f16)" in (
        placed.reason
    )
    assert "kept before the model" in placed.describe()


def test_a_model_larger_than_the_card_gives_layers_for_the_projector() -> None:
    machine = machine_from_profile_name("rtx3060-laptop-6gb")
    model = synthetic("Llama-3.1-8B-Instruct")
    alone = plan(model, machine, Wishes(n_ctx=8192))  # a context the user chose stays
    together, placed = plan_together(model, alone, GEMMA3_4B, machine, Wishes(n_ctx=8192), name="p")
    assert placed.use_gpu and together.n_ctx == 8192
    assert together.n_gpu_layers < alone.n_gpu_layers
    assert "GPU layers instead of" in placed.reason


def test_pinned_layers_stay_and_no_offload_leaves_the_model_as_planned() -> None:
    machine = machine_from_profile_name("rtx2060-6gb")
    model = synthetic("gemma-3-4b-it")
    pinned = Wishes(n_gpu_layers=99)
    alone = plan(model, machine, pinned)
    together, placed = plan_together(model, alone, GEMMA3_4B, machine, pinned, name="p")
    assert placed.use_gpu and together.n_gpu_layers == alone.n_gpu_layers  # -ngl as given
    alone = plan(model, machine, Wishes())
    together, placed = plan_together(
        model, alone, GEMMA3_4B, machine, Wishes(), name="p", offload=False
    )
    assert together is alone and placed.device == "CPU" and placed.fits
    on_cpu = cpu_machine()
    alone = plan(model, on_cpu, Wishes())
    together, placed = plan_together(model, alone, GEMMA3_4B, on_cpu, Wishes(), name="p")
    assert together is alone and placed.device == "CPU"


def test_a_projector_with_room_beside_the_model_is_counted_in_its_plan() -> None:
    """Where the model's plan left room, the projector goes there as before, and the plan's
    free memory no longer counts it (a draft model placed next cannot take the same bytes)."""
    machine = machine_from_profile_name("rtx3060-laptop-6gb")
    model = synthetic("gemma-3-4b-it")
    alone = plan(model, machine, SMALL_CTX)
    together, placed = plan_together(model, alone, GEMMA3_4B, machine, SMALL_CTX, name="p")
    assert placed.use_gpu and "was free there beside the model" in placed.reason
    assert (together.n_ctx, together.type_k, together.n_gpu_layers) == (
        alone.n_ctx,
        alone.type_k,
        alone.n_gpu_layers,
    )
    before, after = alone.device_memory(alone.gpu), together.device_memory(together.gpu)
    assert before is not None and after is not None
    assert after.free_left == pytest.approx(before.free_left - gpu_need(GEMMA3_4B), abs=MiB)


def test_a_projector_that_fits_nowhere_says_what_to_do() -> None:
    machine = cpu_machine(ram_available=3 * GiB)
    target = plan(synthetic("gemma-3-4b-it"), machine, Wishes(n_ctx=4096))
    placed = plan_projector(target, GEMMA3_4B, machine, name="mmproj.gguf")
    assert not placed.fits
    assert "fits nowhere" in placed.describe() and "a smaller -c leaves more" in placed.reason


def test_an_image_costs_its_tokens_in_the_kv_cache_of_the_plan() -> None:
    machine = cpu_machine()
    target = plan(synthetic("gemma-3-4b-it"), machine, Wishes(n_ctx=4096))
    placed = plan_projector(target, GEMMA3_4B, machine, name="p")
    kv = sum(m.kv for m in target.memory)
    assert placed.image_kv == 256 * kv // target.n_ctx


def test_attention_without_flash_attention_holds_every_heads_scores() -> None:
    fused = projector_compute(GEMMA3_4B, flash_attn=True)
    unfused = projector_compute(GEMMA3_4B, flash_attn=False)
    assert unfused - fused > 900 * MiB  # 16 heads x 4096^2 floats: llama.cpp reports 1132 MiB
    assert unfused == pytest.approx(1132 * MiB, rel=0.15)


def test_the_header_says_the_projectors_facts(tmp_path: Path) -> None:
    path = MMPROJ.write_projector(tmp_path / "mmproj.gguf", 640)
    facts = read_projector(path)
    assert (facts.projector_type, facts.image_size, facts.patch_size) == ("gemma3", 64, 8)
    assert facts.image_tokens == MMPROJ.IMAGE_TOKENS and facts.projection_dim == 640
    assert facts.weights_type_size == 4 and 0 < facts.weights < path.stat().st_size


def test_a_model_file_is_not_a_projector(model_path: Path) -> None:
    from localfab.errors import ModelError

    with pytest.raises(ModelError, match="is not a vision projector"):
        read_projector(model_path)


# --- calibration against llama.cpp --------------------------------------------------------------

SHAPES = {
    "the test projector": MMPROJ.TINY,
    "Gemma 3's at 896 px (2 of its layers)": MMPROJ.Dims(
        image_size=896, patch=14, merge=4, hidden=1152, ffn=4304, heads=16, layers=2, f16=True
    ),
    "a SigLIP at 448 px": MMPROJ.Dims(
        image_size=448, patch=14, merge=2, hidden=768, ffn=3072, heads=12, layers=2, f16=True
    ),
}


@pytest.mark.model
@pytest.mark.parametrize("shape", SHAPES)
def test_calibration_against_llama_cpp(model_path: Path, tmp_path: Path, shape: str) -> None:
    """The plan's projector weights within 3 % and compute within 15 % of the sizes llama.cpp
    logs when it loads the projector (CPU buffers), as for the model's own buffers."""
    from localfab.engine import EngineSettings
    from localfab.engine.vision import attach_projector
    from localfab.runtime import load_model

    path = MMPROJ.write_projector(tmp_path / "mmproj.gguf", 640, dims=SHAPES[shape])
    facts = read_projector(path)
    loaded = load_model(model_path, EngineSettings(n_ctx=1024, n_ubatch=512))
    try:
        projector = attach_projector(loaded.engine, path, use_gpu=False)
        assert projector.weights_bytes > 0 and projector.compute_bytes > 0
        assert facts.weights == pytest.approx(projector.weights_bytes, rel=0.03)
        assert projector_compute(facts) == pytest.approx(projector.compute_bytes, rel=0.15)
    finally:
        loaded.close()
