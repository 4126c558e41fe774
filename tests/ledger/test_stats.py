"""`localfab stats` through the installed command, on a seeded ledger with known answers."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from localfab.ledger.report import parse_since
from localfab.ledger.writer import Ledger, PlanInfo, Row
from localfab.units import GiB
from tests.conftest import LOCALFAB

PLAN_A = PlanInfo(0, 4096, "f16", "f16", "on", 2)
PLAN_B = PlanInfo(0, 4096, "q8_0", "q8_0", "on", 2)


def at(day: str) -> float:
    return time.mktime(time.strptime(f"{day} 12:00", "%Y-%m-%d %H:%M"))


def seeded(home: Path) -> Ledger:
    """Baseline base-a (3 replies, plan A) and base-b (2 replies, plan B) on two days, plus one
    `run` reply of another model without energy."""
    ledger = Ledger(home / "data" / "ledger.sqlite3")

    def add(label: str, plan: PlanInfo, day: str, tok_s: float, p50: float, p99: float,
            mem: int, joules: float | None, model: str = "gemma") -> None:  # fmt: skip
        ok = ledger.record(
            Row(
                frontend="bench" if label else "run",
                model=model,
                plan=plan,
                prompt_tokens=100,
                cached_tokens=0,
                generated_tokens=20,
                ttft_ms=200.0,
                itl_p50_ms=p50,
                itl_p99_ms=p99,
                decode_tok_s=tok_s,
                peak_memory={"ram": mem},
                energy_j=joules,
                tokens_per_j=None if joules is None else 20 / joules,
                energy_source="" if joules is None else "rapl:package-0",
                energy_note="" if joules is not None else "no power source on this machine",
                label=label,
                depth=0 if label else None,
                at=at(day),
            )
        )
        assert ok

    add("base-a", PLAN_A, "2026-01-10", 10.0, 50.0, 100.0, 1 * GiB, 10.0)
    add("base-a", PLAN_A, "2026-01-10", 20.0, 40.0, 200.0, 2 * GiB, 10.0)
    add("base-a", PLAN_A, "2026-01-10", 30.0, 60.0, 300.0, 1 * GiB, 10.0)
    add("base-b", PLAN_B, "2026-01-12", 30.0, 20.0, 100.0, 1 * GiB, 5.0)
    add("base-b", PLAN_B, "2026-01-12", 50.0, 30.0, 100.0, 1 * GiB, 5.0)
    add("", PLAN_A, "2026-01-12", 8.0, 100.0, 150.0, 3 * GiB, None, model="qwen")
    return ledger


def lf(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture()
def home(lf_env: dict[str, str]) -> Path:
    path = Path(lf_env["LOCALFAB_HOME"])
    seeded(path)
    return path


def test_totals_and_medians_per_model_plan_and_day(home: Path, lf_env: dict[str, str]) -> None:
    proc = lf(["stats", "--json"], lf_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["replies"] == 6
    models = {m["key"]: m for m in data["models"]}
    gemma = models["gemma"]
    assert (gemma["replies"], gemma["generated_tokens"], gemma["prompt_tokens"]) == (5, 100, 500)
    assert gemma["decode_tok_s"] == 30.0  # median of 10, 20, 30, 30, 50
    assert gemma["itl_p50_ms"] == 40.0
    assert gemma["energy_j"] == 40.0 and gemma["j_per_token"] == pytest.approx(0.4)
    assert gemma["peak_memory"] == 2 * GiB
    qwen = models["qwen"]
    assert qwen["energy_j"] is None and qwen["energy_missing"] == 1
    plans = {p["key"]: p for p in data["plans"]}
    assert plans[PLAN_A.key]["replies"] == 4 and plans[PLAN_B.key]["replies"] == 2
    assert "kv q8_0/q8_0" in plans[PLAN_B.key]["detail"]
    days = {d["key"]: d["replies"] for d in data["days"]}
    assert days == {"2026-01-10": 3, "2026-01-12": 3}
    assert data["energy_missing"] == [{"reason": "no power source on this machine", "replies": 1}]


def test_text_report(home: Path, lf_env: dict[str, str]) -> None:
    proc = lf(["stats"], lf_env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "(6 replies)" in out
    for heading in ("By model", "By plan", "By day", "Energy not measured"):
        assert heading in out
    gemma = next(line for line in out.splitlines() if line.strip().startswith("gemma"))
    assert gemma.split()[:4] == ["gemma", "5", "100", "30.0"]
    assert "1 reply: no power source on this machine" in out


def test_since_and_model_filters(home: Path, lf_env: dict[str, str]) -> None:
    data = json.loads(lf(["stats", "--json", "--since", "2026-01-11"], lf_env).stdout)
    assert data["replies"] == 3
    data = json.loads(lf(["stats", "--json", "--model", "qwen"], lf_env).stdout)
    assert data["replies"] == 1 and data["models"][0]["key"] == "qwen"
    proc = lf(["stats", "--model", "nothing-like-it"], lf_env)
    assert proc.returncode == 0 and "No replies recorded yet for that selection." in proc.stdout


def test_compare_two_baselines(home: Path, lf_env: dict[str, str]) -> None:
    proc = lf(["stats", "--compare", "base-a", "base-b", "--json"], lf_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    changes = {c["number"]: c for c in data["changes"]}
    assert changes["decode_tok_s"]["a"] == 20.0 and changes["decode_tok_s"]["b"] == 40.0
    assert changes["decode_tok_s"]["percent"] == pytest.approx(100.0)
    assert changes["decode_tok_s"]["verdict"] == "better"
    assert changes["itl_p50_ms"]["change"] == pytest.approx(-25.0)
    assert changes["itl_p50_ms"]["percent"] == pytest.approx(-50.0)
    assert changes["itl_p99_ms"]["b"] == 100.0 and changes["itl_p99_ms"]["a"] == 200.0
    assert changes["peak_memory"]["change"] == -1 * GiB
    assert changes["peak_memory"]["verdict"] == "better"
    assert changes["j_per_token"]["a"] == pytest.approx(0.5)
    assert changes["j_per_token"]["b"] == pytest.approx(0.25)
    assert changes["tokens_per_j"]["percent"] == pytest.approx(100.0)
    text = lf(["stats", "--compare", "base-a", "base-b"], lf_env).stdout
    tok_line = next(line for line in text.splitlines() if "decode tok/s" in line)
    assert "+20.0 (+100.0%) better" in tok_line


def test_compare_plans_by_id_prefix(home: Path, lf_env: dict[str, str]) -> None:
    proc = lf(["stats", "--compare", PLAN_A.key, PLAN_B.key[:5], "--json"], lf_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["a"]["replies"] == 4 and data["b"]["replies"] == 2
    assert data["a"]["name"].startswith(f"plan {PLAN_A.key}")


def test_bad_input_is_one_clean_error(home: Path, lf_env: dict[str, str]) -> None:
    proc = lf(["stats", "--since", "last tuesday"], lf_env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "30m, 12h, 7d, 2w" in proc.stderr
    proc = lf(["stats", "--compare", "base-a", "nope"], lf_env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no baseline or plan called 'nope'" in proc.stderr and "base-a, base-b" in proc.stderr


def test_skipped_rows_and_corrupt_ledger_are_explained(home: Path, lf_env: dict[str, str]) -> None:
    ledger = Ledger(home / "data" / "ledger.sqlite3")
    holder = sqlite3.connect(ledger.path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        assert not ledger.record(_one_row())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    proc = lf(["stats"], lf_env)
    assert "1 repl(ies) were not recorded" in proc.stdout and "locked" in proc.stdout
    for extra in ("-wal", "-shm"):
        Path(str(ledger.path) + extra).unlink(missing_ok=True)
    ledger.path.write_bytes(b"garbage" * 1000)
    proc = lf(["stats"], lf_env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "corrupt" in proc.stderr and "mv " in proc.stderr


def _one_row() -> Row:
    return Row(
        frontend="run",
        model="gemma",
        plan=PLAN_A,
        prompt_tokens=1,
        cached_tokens=0,
        generated_tokens=1,
        ttft_ms=None,
        itl_p50_ms=None,
        itl_p99_ms=None,
        decode_tok_s=None,
    )


def test_parse_since() -> None:
    now = 1_000_000.0
    assert parse_since("30m", now=now) == now - 1800
    assert parse_since("2d", now=now) == now - 2 * 86400
    assert parse_since("2026-01-11") == at("2026-01-11") - 12 * 3600
