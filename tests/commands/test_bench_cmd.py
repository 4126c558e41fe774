"""`localfab bench` on the test model: a labelled baseline, its chart, and a comparison."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from localfab.commands.benchmark import DepthResult, chart, parse_depths
from localfab.errors import UsageError
from localfab.ledger.writer import Ledger
from tests.conftest import LOCALFAB


def lf(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args], input="", capture_output=True, text=True, env=env, timeout=600
    )


SMALL = ["--depths", "0,64", "-n", "4", "--prompts", "1", "-c", "512"]


@pytest.mark.model
def test_bench_records_a_baseline_and_compares(model_path: Path, lf_env: dict[str, str]) -> None:
    proc = lf(["bench", str(model_path), "--label", "first", "--json", *SMALL], lf_env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["label"] == "first" and data["saved"] == 2
    assert data["plan"]["n_ctx"] == 512
    depths = data["depths"]
    assert [d["depth"] for d in depths] == [0, 64]
    for d in depths:
        assert d["replies"] == 1
        assert d["decode_tok_s"] > 0 and d["itl_p99_ms"] >= d["itl_p50_ms"] > 0
        assert d["ttft_ms"] > 0 and d["peak_memory"] > 0
    rows = Ledger(Path(lf_env["LOCALFAB_HOME"]) / "data" / "ledger.sqlite3").rows()
    assert [(r["label"], r["depth"], r["frontend"]) for r in rows] == [
        ("first", 0, "bench"),
        ("first", 64, "bench"),
    ]
    # The prompt at depth 64 is 64 tokens long; generation is exactly -n tokens.
    assert rows[1]["prompt_tokens"] == 64
    assert all(r["generated_tokens"] == 4 for r in rows)
    assert rows[0]["model_sha256"] and len(rows[0]["model_sha256"]) == 64

    proc = lf(["bench", str(model_path), "--label", "second", "--compare", "first", *SMALL], lf_env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("Baseline second: plan p")
    assert "decode tok/s by context depth" in out
    bars = [line for line in out.splitlines() if "│" in line and "tok/s" in line]
    assert len(bars) == 4  # A and B for each of two depths
    assert "A: baseline first" in out and "B: baseline second" in out
    assert "latency p99 (ms/token)" in out

    stats = lf(["stats", "--compare", "first", "second", "--json"], lf_env)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["a"]["replies"] == 2


@pytest.mark.model
def test_bench_bad_input(model_path: Path, lf_env: dict[str, str]) -> None:
    proc = lf(["bench", str(model_path), "--compare", "never-recorded", *SMALL], lf_env)
    assert proc.returncode == 2 and "no baseline called 'never-recorded'" in proc.stderr
    proc = lf(["bench", str(model_path), "--depths", "0,600", "-n", "4", "-c", "512"], lf_env)
    assert proc.returncode == 2 and "depth 600" in proc.stderr and "Traceback" not in proc.stderr
    proc = lf(["bench", str(model_path), "-n", "1"], lf_env)
    assert proc.returncode == 2 and "--n-gen" in proc.stderr


def test_parse_depths() -> None:
    assert parse_depths("2048, 0,512,512") == [0, 512, 2048]
    for bad in ("a,b", "", "-5"):
        with pytest.raises(UsageError):
            parse_depths(bad)


def result(depth: int, tok_s: float | None, j: float | None = None) -> DepthResult:
    return DepthResult(depth, 1, tok_s, 10.0, 20.0, 30.0, 1, j, None if j is None else 1 / j)


def test_chart_scales_bars_to_the_fastest() -> None:
    text = chart([result(0, 40.0, 0.5), result(2048, 20.0), result(4096, None)])
    lines = text.splitlines()
    assert lines[1].count("█") == 40 and "40.0 tok/s  0.500 J/token" in lines[1]
    assert lines[2].count("█") == 20 and "J/token" not in lines[2]
    assert "(no decode figure)" in lines[3]
    before = chart([result(0, 10.0)], [result(0, 20.0)])
    a, b = before.splitlines()[1:]
    assert a.count("█") == 40 and a.split("│")[0].strip() == "A"
    assert b.count("█") == 20 and b.split("│")[0].split() == ["0", "B"]
