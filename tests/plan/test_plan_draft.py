"""The draft model of speculative decoding is planned beside the model: GPU, CPU, or nowhere."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from localfab.engine.types import SpecSettings
from localfab.machine.probes import GiB, machine_from_profile_name
from localfab.plan import plan
from localfab.plan.draft import plan_draft
from localfab.runtime import ModelChoice, probe_this_machine
from tests.plan.test_plan import GEMMA_270M, cpu_machine, synthetic

DRAFT = synthetic(GEMMA_270M)


def test_a_draft_goes_to_the_gpu_when_it_fits_beside_the_model() -> None:
    machine = machine_from_profile_name("radeon-780m-8gb")
    target = plan(synthetic("gemma-3-4b-it"), machine)
    placed = plan_draft(target, DRAFT, machine, name="gemma-270m.gguf")
    assert placed.fits and placed.device == target.gpu
    assert placed.n_gpu_layers == DRAFT.n_layer + 1
    assert placed.weights > 200 * 2**20 and placed.kv > 0 and placed.compute > 0
    assert placed.total <= placed.room
    assert "on the GPU (AMD Radeon 780M)" in placed.describe()


def test_a_draft_goes_to_the_cpu_when_the_model_fills_the_gpu() -> None:
    machine = machine_from_profile_name("rtx3060-laptop-6gb")
    target = plan(synthetic("Llama-3.1-8B-Instruct"), machine)
    gpu_left = target.device_memory(target.gpu or "").free_left  # type: ignore[union-attr]
    placed = plan_draft(target, DRAFT, machine, name="gemma-270m.gguf")
    assert placed.fits and placed.device == "CPU" and placed.n_gpu_layers == 0
    assert gpu_left < placed.total  # it would not have fitted there
    line = placed.describe()
    assert "on the CPU" in line and "the GPU has" in line and "left beside the model" in line


def test_a_draft_that_fits_nowhere_says_what_to_do() -> None:
    machine = cpu_machine(4 * GiB)
    target = plan(synthetic("Llama-3.2-3B-Instruct"), machine)
    assert target.fits
    placed = plan_draft(target, DRAFT, machine, name="gemma-270m.gguf")
    assert not placed.fits
    assert placed.total > placed.room
    assert "fits nowhere" in placed.describe() and "smaller draft model" in placed.describe()


def test_the_draft_is_planned_at_the_models_context() -> None:
    machine = machine_from_profile_name("radeon-780m-8gb")
    small = plan(synthetic("gemma-3-4b-it"), machine)
    big = replace(small, n_ctx=small.n_ctx * 2)
    assert (
        plan_draft(big, DRAFT, machine, name="d").kv
        > plan_draft(small, DRAFT, machine, name="d").kv
    )


def test_opening_a_model_places_its_draft_unless_told_where(model_path: Path) -> None:
    from localfab.gguf.facts import read_facts

    machine = probe_this_machine()
    chosen = ModelChoice("gemma", model_path, plan(read_facts(model_path), machine), machine)
    spec = SpecSettings(spec_type="draft-simple", model_draft=str(model_path))
    placed, notice = chosen.place_draft(spec)
    assert placed is not None and notice is not None
    expected = 0 if chosen.plan.gpu is None else read_facts(model_path).n_layer + 1
    assert placed.n_gpu_layers_draft == expected
    assert f"draft model {model_path.name}:" in notice
    # -ngld stands; a prompt-lookup spec has no draft; a missing file is left to the load.
    told = replace(spec, n_gpu_layers_draft=3)
    assert chosen.place_draft(told) == (told, None)
    ngram = SpecSettings(spec_type="ngram-simple")
    assert chosen.place_draft(ngram) == (ngram, None)
    missing = replace(spec, model_draft=str(model_path.parent / "missing.gguf"))
    assert chosen.place_draft(missing) == (missing, None)
