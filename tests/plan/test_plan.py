"""The planner: calibration against llama.cpp, policy, and properties over random machines."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localfab.errors import UsageError
from localfab.gguf.facts import ModelFacts, read_facts
from localfab.machine.probes import (
    Cpu,
    Device,
    GiB,
    LlamaBackend,
    Machine,
    MiB,
    cpu_for_build,
    load_model_specs,
    machine_from_profile_name,
    probe_cpu,
)
from localfab.plan import (
    DoesNotFit,
    Wishes,
    compute_phases,
    estimate,
    kv_cells,
    plan,
)
from tests.gguf_fixtures import synthetic_source

SPECS = load_model_specs()
GEMMA_270M = "gemma-3-270m (the test model)"


@cache
def synthetic(name: str) -> ModelFacts:
    return read_facts(synthetic_source(SPECS[name], name=name))


def cpu_machine(ram_available: int = 16 * GiB) -> Machine:
    cpu = Cpu(model="test CPU", physical_cores=4, logical_cpus=8, bandwidth_gbs=50.0)
    return Machine(
        cpu=cpu,
        ram_total=max(ram_available, 16 * GiB),
        ram_available=ram_available,
        devices=(),
        backend=LlamaBackend(backends=("CPU",), gpu_offload=False),
    )


def gpu_machine(free: int, *, ram_available: int = 16 * GiB, unified: bool = False) -> Machine:
    """A machine with one GPU whose free memory is `free` (carve-out, for an APU)."""
    if unified:
        gtt = 8 * GiB
        device = Device(
            index=0,
            name="APU",
            vendor="amd",
            kind="vulkan",
            total=free + gtt,
            used=0,
            free=free + gtt,
            unified_memory=True,
            bandwidth_gbs=90.0,
            vram_total=free,
            vram_used=0,
            gtt_total=gtt,
            gtt_used=0,
        )
        backend = LlamaBackend(backends=("CPU", "Vulkan"), gpu_offload=True)
    else:
        device = Device(
            index=0,
            name="GPU",
            vendor="nvidia",
            kind="cuda",
            total=max(free, 6 * GiB),
            used=0,
            free=free,
            bandwidth_gbs=300.0,
        )
        backend = LlamaBackend(backends=("CPU", "CUDA"), gpu_offload=True)
    return replace_devices(cpu_machine(ram_available), (device,), backend)


def replace_devices(m: Machine, devices: tuple[Device, ...], backend: LlamaBackend) -> Machine:
    from dataclasses import replace

    return replace(m, devices=devices, backend=backend)


# --- calibration against llama.cpp -------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("n_ubatch", [128, 512])
@pytest.mark.parametrize("n_ctx", [512, 2048, 8192])
def test_calibration_against_llama_cpp(model_path: Path, n_ctx: int, n_ubatch: int) -> None:
    """Predicted buffers vs the sizes llama.cpp logs when it loads the test model.

    Uses the engine's `measure_buffers`: model, KV and compute
    buffer sizes summed over devices (all CPU here). Acceptance: weights and KV within 3 %,
    compute within 15 %.
    """
    from localfab.engine import backend_info, measure_buffers

    facts = read_facts(model_path)
    cpu, ram_total, ram_available = probe_cpu()
    # This build's system info: one with AMX kernels loads without repacked weights.
    backend = LlamaBackend(
        backends=("CPU",), gpu_offload=False, system_info=str(backend_info()["system_info"])
    )
    machine = Machine(
        cpu=cpu_for_build(cpu, backend),
        ram_total=ram_total,
        ram_available=ram_available,
        devices=(),
        backend=backend,
    )
    reported = measure_buffers(model_path, n_ctx=n_ctx, n_ubatch=n_ubatch, flash_attn="on")
    e = estimate(facts, machine, gpu=None, n_gpu_layers=0, n_ctx=n_ctx, n_ubatch=n_ubatch)
    (mem,) = e.memory
    compute = compute_phases(facts, n_ctx, n_ubatch=n_ubatch, flash_attn=True, swa_full=True).peak
    assert reported.model_bytes > 0 and reported.kv_bytes > 0 and reported.compute_bytes > 0
    assert mem.weights == pytest.approx(reported.model_bytes, rel=0.03)
    assert mem.kv == pytest.approx(reported.kv_bytes, rel=0.03)
    assert compute == pytest.approx(reported.compute_bytes, rel=0.15)


# --- the memory model --------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in SPECS if not SPECS[n].get("sliding_window")])
def test_kv_bytes_follow_the_textbook_formula(name: str) -> None:
    spec = SPECS[name]
    per_token = 2 * spec["n_layer"] * spec["n_head_kv"] * spec["head_dim"] * 2  # models.json
    e = estimate(synthetic(name), cpu_machine(64 * GiB), gpu=None, n_gpu_layers=0, n_ctx=8192)
    assert sum(m.kv for m in e.memory) == per_token * 8192


def test_sliding_window_cache_sizes() -> None:
    f = synthetic("gemma-3-4b-it")
    assert kv_cells(f, 16384, n_ubatch=512, swa_full=True) == (16384, 16384)
    # llama-kv-cache-iswa.cpp: pad256(min(n_ctx, n_swa + n_ubatch))
    assert kv_cells(f, 16384, n_ubatch=512, swa_full=False) == (16384, 1536)
    assert kv_cells(f, 1000, n_ubatch=512, swa_full=False) == (1024, 1024)
    full = estimate(f, cpu_machine(), gpu=None, n_gpu_layers=0, n_ctx=16384, swa_full=True)
    window = estimate(f, cpu_machine(), gpu=None, n_gpu_layers=0, n_ctx=16384, swa_full=False)
    per_cell = 2 * 4 * 256 * 2
    assert full.memory[0].kv == 34 * 16384 * per_cell
    assert window.memory[0].kv == (5 * 16384 + 29 * 1536) * per_cell


def test_output_layer_goes_to_the_gpu_first() -> None:
    f = synthetic("Llama-3.1-8B-Instruct")
    m = gpu_machine(24 * GiB)
    one = estimate(f, m, gpu=m.devices[0], n_gpu_layers=1, n_ctx=4096)
    gpu_mem, cpu_mem = one.memory
    # llama.cpp: -ngl 1 is the output layer alone (output.weight + output_norm)
    assert gpu_mem.weights == f.output_bytes + f.output_norm_bytes
    assert cpu_mem.kv > 0 and gpu_mem.kv == 0
    tied = synthetic("gemma-3-4b-it")
    t = estimate(tied, m, gpu=m.devices[0], n_gpu_layers=1, n_ctx=4096)
    assert t.memory[0].weights == tied.token_embd_bytes + tied.output_norm_bytes  # duplicated


# --- policy ------------------------------------------------------------------------------------


def test_everything_on_the_gpu_when_it_fits() -> None:
    p = plan(synthetic("Llama-3.2-3B-Instruct"), machine_from_profile_name("rtx3060-laptop-6gb"))
    assert p.fits and p.all_on_gpu and not p.partial
    assert (p.type_k, p.n_ctx) == ("f16", 16384)
    assert p.gpu == "NVIDIA GeForce RTX 3060 Laptop GPU" and p.flash_attn


def test_policy_order_kv_then_context_then_partial() -> None:
    f = synthetic("Llama-3.1-8B-Instruct")
    step_of = {}
    for gib in (8, 6.7, 5.9, 5.2, 4.0):
        p = plan(f, gpu_machine(int(gib * GiB)))
        step_of[gib] = (p.step, p.type_k, p.n_ctx, p.n_gpu_layers)
        assert p.fits
    assert step_of[8] == ("fits", "f16", 16384, 33)
    assert step_of[6.7][:3] == ("kv-q8_0", "q8_0", 16384)
    assert step_of[5.9][0] == "ctx" and 4096 <= step_of[5.9][2] < 16384
    assert step_of[5.2][0] == "partial" and step_of[5.2][2] == 4096 and step_of[5.2][3] < 33
    assert step_of[4.0][3] < step_of[5.2][3]


def test_flash_attention_off_keeps_f16_cache() -> None:
    p = plan(synthetic("Llama-3.1-8B-Instruct"), gpu_machine(6 * GiB), Wishes(flash_attn="off"))
    assert (p.type_k, p.type_v, p.flash_attn) == ("f16", "f16", False)
    with pytest.raises(UsageError, match="needs flash attention"):
        plan(
            synthetic("Llama-3.1-8B-Instruct"),
            gpu_machine(6 * GiB),
            Wishes(flash_attn="off", type_v="q8_0"),
        )


def test_user_minimum_context_is_never_undercut() -> None:
    p = plan(synthetic("Qwen3-8B"), gpu_machine(5 * GiB), Wishes(min_ctx=8192))
    assert p.n_ctx >= 8192 and p.partial


def test_cpu_only_build_with_a_gpu_says_how_to_rebuild() -> None:
    f = synthetic("gemma-3-4b-it")
    p = plan(f, machine_from_profile_name("cuda-build-on-780m"))
    assert p.gpu is None and p.n_gpu_layers == 0 and p.fits
    assert p.rebuild is not None and "-DGGML_VULKAN=on" in p.rebuild
    assert any("pip install --force-reinstall --no-cache-dir" in r for r in p.reasons)
    nvidia = machine_from_profile_name("rtx2060-6gb")
    cpu_build = replace_devices(
        nvidia, nvidia.devices, LlamaBackend(backends=("CPU",), gpu_offload=False)
    )
    q = plan(f, cpu_build)
    assert q.gpu is None and q.rebuild is not None and "-DGGML_CUDA=on" in q.rebuild


def test_igpu_budget_is_bounded_by_free_ram_and_explained() -> None:
    f = synthetic("Llama-3.1-8B-Instruct")
    roomy = plan(f, machine_from_profile_name("radeon-780m-512mb"))
    assert roomy.all_on_gpu and roomy.fits
    assert any("prompt processing" in r and "decoding" in r for r in roomy.reasons)
    # plenty of GTT, but little free RAM: the GTT share must come out of it
    tight = plan(f, gpu_machine(512 * MiB, ram_available=5 * GiB, unified=True))
    gpu_mem = tight.device_memory("APU")
    cpu_mem = tight.device_memory("CPU")
    assert gpu_mem is not None and cpu_mem is not None
    if tight.fits:
        taken = max(0, gpu_mem.total - 512 * MiB)
        assert cpu_mem.total + taken <= 5 * GiB
    assert tight.n_gpu_layers < roomy.n_gpu_layers or tight.n_ctx < roomy.n_ctx


def test_explicit_overrides_are_honoured_and_costed() -> None:
    f = synthetic("Llama-3.1-8B-Instruct")
    m = machine_from_profile_name("rtx3060-laptop-6gb")
    p = plan(f, m, Wishes(n_gpu_layers=10, n_ctx=8192, type_k="q4_0", type_v="q4_0"))
    assert (p.n_gpu_layers, p.n_ctx, p.type_k, p.type_v) == (10, 8192, "q4_0", "q4_0")
    assert p.costs and "-ngl 10" in p.costs[0] and "automatic plan" in p.costs[0]
    assert any("tok/s against" in c for c in p.costs)
    greedy = plan(f, m, Wishes(n_gpu_layers=-1, n_ctx=131072))
    assert greedy.n_gpu_layers == 33 and not greedy.fits
    assert any("run out of memory" in w for w in greedy.warnings)
    beyond = plan(synthetic("Qwen2.5-7B-Instruct"), cpu_machine(64 * GiB), Wishes(n_ctx=65536))
    assert any("beyond the 32768 tokens" in w for w in beyond.warnings)


def test_too_little_memory_is_said_plainly() -> None:
    p = plan(synthetic("Qwen3-8B"), cpu_machine(2 * GiB))
    assert not p.fits and p.step == "does-not-fit"
    with pytest.raises(DoesNotFit, match="does not fit"):
        p.require_fit()


def test_tiny_gpu_stays_idle() -> None:
    p = plan(synthetic("Llama-3.1-8B-Instruct"), gpu_machine(300 * MiB))
    assert p.fits and p.n_gpu_layers == 0 and not p.op_offload
    gpu_mem = p.device_memory("GPU")
    assert gpu_mem is not None and gpu_mem.total == 0


def test_plan_to_dict_and_engine_settings() -> None:
    from localfab.engine.types import EngineSettings

    p = plan(synthetic(GEMMA_270M), machine_from_profile_name("gtx1660ti-laptop-6gb"))
    data = json.loads(json.dumps(p.to_dict()))
    gpu = data["memory"]["NVIDIA GeForce GTX 1660 Ti"]
    assert gpu["total"] == gpu["weights"] + gpu["kv"] + gpu["compute"] + gpu["reserve"]
    assert data["memory_by_kind"]["kv"] == sum(m["kv"] for m in data["memory"].values())
    assert data["n_gpu_layers"] == 19 and data["output_on_gpu"]
    settings = EngineSettings(**p.settings_kwargs())
    assert settings.n_gpu_layers == 19 and settings.swa_full


def test_wishes_the_planner_cannot_honour_are_usage_errors() -> None:
    f, m = synthetic("Llama-3.2-3B-Instruct"), gpu_machine(6 * GiB)
    for wishes, message in (
        (Wishes(flash_attn="maybe"), "use auto, on or off"),
        (Wishes(type_k="q9_0"), "unknown KV cache type"),
        (Wishes(n_ctx=-5), "at least 1 token"),
    ):
        with pytest.raises(UsageError, match=message):
            plan(f, m, wishes)


def test_physical_batch_never_exceeds_the_logical_batch() -> None:
    f, m = synthetic("Llama-3.2-3B-Instruct"), gpu_machine(6 * GiB)
    small = plan(f, m, Wishes(n_batch=128))
    assert (small.n_batch, small.n_ubatch) == (128, 128)
    big = plan(f, m, Wishes(n_ubatch=1024))
    assert (big.n_batch, big.n_ubatch) == (2048, 1024)


def test_reasons_name_where_the_model_did_not_fit() -> None:
    f = synthetic("Llama-3.1-8B-Instruct")
    on_cpu = plan(f, cpu_machine(9 * GiB))
    assert on_cpu.step == "ctx" and on_cpu.n_ctx < 16384
    assert any("do not fit in memory" in r for r in on_cpu.reasons)
    layers = plan(f, gpu_machine(3 * GiB), Wishes(n_gpu_layers=12))
    assert layers.step == "ctx" and layers.n_gpu_layers == 12
    assert any("do not fit with 12 layers on GPU" in r for r in layers.reasons)


def test_gpu_layers_without_a_usable_gpu_are_ignored_with_a_warning() -> None:
    p = plan(synthetic("Llama-3.2-3B-Instruct"), cpu_machine(), Wishes(n_gpu_layers=10))
    assert p.n_gpu_layers == 0 and p.gpu is None and p.fits
    assert any("-ngl 10 ignored" in w for w in p.warnings)


def test_a_backend_probe_error_is_a_warning() -> None:
    m = cpu_machine()
    broken = replace_devices(
        m, (), LlamaBackend(backends=("CPU",), gpu_offload=False, error="OSError: libllama.so")
    )
    p = plan(synthetic("Llama-3.2-3B-Instruct"), broken)
    assert any("could not ask llama-cpp-python" in w and "libllama.so" in w for w in p.warnings)


def test_two_gpus_the_plan_takes_the_one_with_most_free_memory_and_says_so() -> None:
    from dataclasses import replace

    m = gpu_machine(6 * GiB)
    (big,) = m.devices
    small = replace(big, index=1, name="Small GPU", free=2 * GiB)
    two = replace_devices(m, (small, big), m.backend)
    p = plan(synthetic("Llama-3.2-3B-Instruct"), two)
    assert p.gpu == "GPU"
    assert any("Planning for GPU only; Small GPU not used" in r for r in p.reasons)


def test_window_only_sliding_cache_says_it_cannot_shift() -> None:
    p = plan(synthetic("gemma-3-4b-it"), gpu_machine(8 * GiB), Wishes(swa_full=False))
    assert not p.swa_full
    assert any("swa_full off" in r and "cannot be shifted" in r for r in p.reasons)


def test_threads_follow_physical_cores_and_hint_at_performance_cores() -> None:
    from dataclasses import replace

    m = cpu_machine()
    hybrid = replace(m, cpu=replace(m.cpu, physical_cores=10, performance_cores=2))
    p = plan(synthetic("Llama-3.2-3B-Instruct"), hybrid)
    assert p.threads == 10
    assert any("2 performance cores" in r and "--threads 2" in r for r in p.reasons)
    asked = plan(synthetic("Llama-3.2-3B-Instruct"), hybrid, Wishes(threads=3))
    assert asked.threads == 3 and any("3 CPU threads: as you asked." in r for r in asked.reasons)


def test_unknown_bandwidths_are_stated_as_assumptions() -> None:
    from dataclasses import replace

    m = gpu_machine(12 * GiB)
    unknown = replace(
        m,
        cpu=replace(m.cpu, bandwidth_gbs=None),
        devices=(replace(m.devices[0], bandwidth_gbs=None),),
    )
    known = plan(synthetic("Llama-3.2-3B-Instruct"), m)
    p = plan(synthetic("Llama-3.2-3B-Instruct"), unknown)
    assert known.assumptions == ()
    assert any("bandwidth of GPU unknown: assumed 200 GB/s" in a for a in p.assumptions)
    assert any("RAM bandwidth unknown" in a for a in p.assumptions)
    assert p.predicted_tok_s < known.predicted_tok_s  # 200 GB/s assumed, against 300 known


# --- properties --------------------------------------------------------------------------------

models = st.sampled_from(list(SPECS))
vram_mib = st.integers(min_value=0, max_value=24 * 1024)
ram_mib = st.integers(min_value=1024, max_value=64 * 1024)
floors = st.sampled_from([1024, 2048, 4096, 8192])
PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _within_budget(p, machine: Machine) -> None:  # type: ignore[no-untyped-def]
    for m in p.memory:
        assert m.free_left >= 0, (m.device, m.total, m.available)
    gpu = machine.devices[0] if machine.devices else None
    if gpu is not None and gpu.unified_memory:
        g, c = p.device_memory(gpu.name), p.device_memory("CPU")
        assert g.total <= gpu.free
        assert c.total + max(0, g.total - gpu.vram_free) <= machine.ram_available


@PROPS
@given(name=models, vram=vram_mib, ram=ram_mib, unified=st.booleans(), floor=floors)
def test_plan_never_exceeds_a_budget(
    name: str, vram: int, ram: int, unified: bool, floor: int
) -> None:
    machine = gpu_machine(vram * MiB, ram_available=ram * MiB, unified=unified)
    p = plan(synthetic(name), machine, Wishes(min_ctx=floor))
    if p.fits:
        _within_budget(p, machine)
        assert p.n_ctx >= min(floor, synthetic(name).n_ctx_train)


@PROPS
@given(
    name=models,
    v1=vram_mib,
    extra=st.integers(min_value=0, max_value=8 * 1024),
    ram=ram_mib,
    unified=st.booleans(),
)
def test_more_vram_never_gives_fewer_layers_or_less_context(
    name: str, v1: int, extra: int, ram: int, unified: bool
) -> None:
    f = synthetic(name)
    small = plan(f, gpu_machine(v1 * MiB, ram_available=ram * MiB, unified=unified))
    big = plan(f, gpu_machine((v1 + extra) * MiB, ram_available=ram * MiB, unified=unified))
    if small.fits:
        assert big.fits
        assert big.n_gpu_layers >= small.n_gpu_layers
        assert big.n_ctx >= small.n_ctx


@PROPS
@given(
    name=models,
    vram=vram_mib,
    ram=ram_mib,
    unified=st.booleans(),
    fa=st.sampled_from(["auto", "off"]),
)
def test_a_plan_that_fits_on_the_gpu_is_never_partial(
    name: str, vram: int, ram: int, unified: bool, fa: str
) -> None:
    f = synthetic(name)
    machine = gpu_machine(vram * MiB, ram_available=ram * MiB, unified=unified)
    p = plan(f, machine, Wishes(flash_attn=fa))
    floor = min(4096, f.n_ctx_train)
    smallest = "q8_0" if fa == "auto" else "f16"
    whole = estimate(
        f,
        machine,
        gpu=machine.devices[0],
        n_gpu_layers=f.n_layer + 1,
        n_ctx=floor,
        type_k=smallest,
        type_v=smallest,
        flash_attn=fa != "off",
    )
    if whole.fits:
        assert p.all_on_gpu and not p.partial
    if p.partial:
        assert not whole.fits


def test_the_prompt_cache_gets_half_the_ram_the_load_leaves_free_and_plan_says_so() -> None:
    f = synthetic("Llama-3.1-8B-Instruct")
    roomy = plan(f, gpu_machine(8 * GiB, ram_available=32 * GiB))
    assert roomy.prompt_cache == 8 * GiB  # llama-server's --cache-ram default at most
    tight = plan(f, gpu_machine(4 * GiB, ram_available=6 * GiB))  # layers spill into RAM
    cpu_mem = tight.device_memory("CPU")
    assert cpu_mem is not None and cpu_mem.weights > 0
    assert tight.prompt_cache == max(0, cpu_mem.free_left) // 2 < 3 * GiB
    why = [r for r in tight.reasons if r.startswith("Prompt cache:")]
    assert len(why) == 1 and "KiB per token" in why[0] and "half of what this load" in why[0]
    assert tight.to_dict()["prompt_cache_ram"] == tight.prompt_cache
