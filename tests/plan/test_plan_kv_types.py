"""KV cache types as a type: the Literal names what every layer offers, and a plan holds one."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from localfab import units
from localfab.errors import UsageError
from localfab.gguf.facts import read_facts
from localfab.machine.probes import Cpu, LlamaBackend, Machine
from localfab.plan import KvCacheType, Wishes, check_kv_type, plan
from localfab.units import GiB


def test_the_plan_types_its_kv_caches_with_the_one_vocabulary() -> None:
    from gguf import GGMLQuantizationType

    from localfab.plan import kv_types

    # One Literal, defined in units: the planner re-exports it rather than spelling it again.
    assert KvCacheType is units.KvCacheType and kv_types.KvCacheType is units.KvCacheType
    assert get_args(units.KvCacheType) == units.KV_CACHE_TYPES
    # llama.cpp's -ctk / -ctv names, in its order, each a ggml type the engine can hand over.
    assert units.KV_CACHE_TYPES[:4] == ("f32", "f16", "bf16", "q8_0")
    for name in units.KV_CACHE_TYPES:
        assert GGMLQuantizationType[name.upper()].name.lower() == name
    # The guard is exact: user input goes through `check_kv_type`, which lowers the case first.
    assert units.is_kv_cache_type("q8_0") and not units.is_kv_cache_type("Q8_0")
    assert not units.is_kv_cache_type("q9_0")


def test_check_kv_type_takes_any_case_and_names_the_choices() -> None:
    assert check_kv_type("Q8_0", "-ctk") == "q8_0"
    assert [check_kv_type(name.upper(), "-ctv") for name in units.KV_CACHE_TYPES] == list(
        units.KV_CACHE_TYPES
    )
    with pytest.raises(UsageError) as info:
        check_kv_type("q9_0", "-ctv")
    message = str(info.value)
    assert message.startswith("-ctv q9_0: unknown KV cache type")
    assert ", ".join(units.KV_CACHE_TYPES) in message


def test_a_plan_holds_the_checked_kv_types(model_path: Path) -> None:
    facts = read_facts(model_path)  # the header only: nothing is loaded
    machine = Machine(
        cpu=Cpu(model="test CPU", physical_cores=4, logical_cpus=8, bandwidth_gbs=50.0),
        ram_total=16 * GiB,
        ram_available=16 * GiB,
        devices=(),
        backend=LlamaBackend(backends=("CPU",), gpu_offload=False),
    )
    chosen = plan(facts, machine, Wishes(type_k="Q4_0", type_v="q4_0", flash_attn="on"))
    assert (chosen.type_k, chosen.type_v) == ("q4_0", "q4_0")
    auto = plan(facts, machine, Wishes())
    assert auto.type_k in get_args(KvCacheType) and auto.type_v in get_args(KvCacheType)
