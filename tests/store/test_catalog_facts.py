"""The catalog's shipped header facts: a summary plans as the header it came from, the script
that writes them reads real headers on a hub, and every catalog model has facts."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from localfab.gguf.facts import ModelFacts, read_facts
from localfab.gguf.summary import catalog_facts, facts_from_summary, summarize
from localfab.machine.probes import load_model_specs, machine_from_profile_name
from localfab.plan import Wishes, plan
from localfab.store.catalog import load_catalog
from tests.gguf_fixtures import build_header, synthetic_model, write_sparse
from tests.hf_server import FakeHub

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ("rtx3060-laptop-6gb", "radeon-780m-8gb")


def _script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "catalog_facts", ROOT / "scripts/catalog_facts.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same_facts(a: ModelFacts, b: ModelFacts) -> None:
    for f in dataclasses.fields(ModelFacts):
        if f.compare and f.name != "chat_template":  # the template is not kept
            assert getattr(a, f.name) == getattr(b, f.name), f.name


def same_plans(a: ModelFacts, b: ModelFacts) -> None:
    for profile in PROFILES:
        machine = machine_from_profile_name(profile)
        assert plan(a, machine, Wishes()) == plan(b, machine, Wishes()), profile


@pytest.mark.parametrize("name", list(load_model_specs()))
def test_a_summary_gives_back_the_facts_and_the_plan_of_its_header(
    name: str, tmp_path: Path
) -> None:
    meta, tensors = synthetic_model(load_model_specs()[name], name=name)
    header, total = build_header(meta, tensors)
    path = write_sparse(tmp_path / "m.gguf", header, total)
    live = read_facts(path)
    summary = json.loads(json.dumps(summarize(live)))  # as shipped: through JSON
    assert len(json.dumps(summary)) < 20_000
    back = facts_from_summary(summary)
    same_facts(live, back)
    same_plans(live, back)


def test_the_real_test_model_round_trips(model_path: Path) -> None:
    live = read_facts(model_path)
    back = facts_from_summary(json.loads(json.dumps(summarize(live))))
    same_facts(live, back)
    same_plans(live, back)


def test_the_script_reads_the_header_on_the_hub(env: Path, fake: FakeHub, tmp_path: Path) -> None:
    entry = next(e for e in load_catalog() if e.name == "qwen2.5:7b")
    meta, tensors = synthetic_model(load_model_specs()["Qwen2.5-7B-Instruct"], name="q")
    header, total = build_header(meta, tensors)
    local = write_sparse(tmp_path / "q.gguf", header, total)  # sparse: the header, then a hole
    fake.add_file(entry.repo, entry.files[0], disk=local, sha256="0" * 64)
    said: list[str] = []
    out = _script().build([entry], configs=False, say=said.append)
    assert out[entry.name]["source"] == "header" and "header read on the hub" in said[0]
    assert out[entry.name] == summarize(read_facts(local))
    assert fake.bytes_sent() < 10 * len(header)  # only the header was read


def test_offline_the_script_falls_back_to_published_configs(monkeypatch: Any) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    entry = next(e for e in load_catalog() if e.name == "gemma3:1b")
    out = _script().build([entry], configs=True, say=lambda s: None)
    assert out[entry.name]["source"] == "config"
    with pytest.raises(Exception, match="cannot reach"):
        _script().build([entry], configs=False, say=lambda s: None)


def test_every_catalog_model_has_shipped_facts_that_match_its_size() -> None:
    for entry in load_catalog():
        shipped = catalog_facts(entry.name)
        assert shipped is not None, entry.name
        facts, source = shipped
        assert source in ("header", "config")
        # The facts describe the file the catalog lists: its tensors are (nearly) its size.
        assert 0.95 < facts.total_tensor_bytes / entry.size_bytes < 1.02, entry.name
