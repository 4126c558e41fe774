"""`localfab serve` records each reply in the usage ledger (never its text); --no-ledger and
LOCALFAB_LEDGER=off turn that off. Real server process, real sockets, the test model."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from localfab.ledger.writer import Ledger, rows_to_dicts
from tests.serverproc import serve

pytestmark = pytest.mark.model

SECRET = "pangolin 4417 saffron lighthouse"


def ledger_of(env: dict[str, str]) -> Path:
    return Path(env["LOCALFAB_HOME"]) / "data" / "ledger.sqlite3"


def ask(url: str, *, stream: bool = False) -> None:
    body = {"prompt": SECRET, "n_predict": 5, "temperature": 0, "stream": stream}
    with httpx.stream("POST", url + "/completion", json=body, timeout=120) as response:
        assert response.status_code == 200
        response.read()


def test_each_reply_is_a_ledger_row_without_its_text(
    model_path: Path, lf_env: dict[str, str]
) -> None:
    with serve(model_path, "-c", "512", env=lf_env) as server:
        ask(server.url)
        ask(server.url, stream=True)
    rows = rows_to_dicts(Ledger(ledger_of(lf_env)).rows())
    assert [r["frontend"] for r in rows] == ["serve", "serve"]
    for row in rows:
        assert row["generated_tokens"] == 5 and row["prompt_tokens"] > 0
        assert row["n_ctx"] == 512
        assert row["decode_tok_s"] > 0 and row["itl_p99_ms"] >= row["itl_p50_ms"] > 0
    # The second request reused the first one's prompt from the cache.
    assert rows[1]["cached_tokens"] > 0
    for file in ledger_of(lf_env).parent.glob("ledger.sqlite3*"):
        assert SECRET.encode() not in file.read_bytes()


@pytest.mark.parametrize("off", ["flag", "env"])
def test_no_ledger_records_nothing(model_path: Path, lf_env: dict[str, str], off: str) -> None:
    args = ["-c", "512"] + (["--no-ledger"] if off == "flag" else [])
    env = dict(lf_env, LOCALFAB_LEDGER="off") if off == "env" else lf_env
    with serve(model_path, *args, env=env) as server:
        ask(server.url)
    path = ledger_of(lf_env)
    assert not path.exists() or Ledger(path).rows() == []


def test_timings_carry_the_energy_where_power_is_read(model_path: Path, tmp_path: Path) -> None:
    """In process, with the energy meter on a fake amdgpu hwmon tree (15 W, sampled)."""
    from localfab.engine import EngineSettings
    from localfab.ledger.writer import LedgerWriter
    from localfab.machine.energy import EnergyMeter, survey
    from localfab.runtime import load_model
    from localfab.server import ServerSettings, create_app
    from localfab.server.runner import BackgroundServer
    from tests.machine.test_energy import hwmon, no_nvml

    hwmon(tmp_path, 0, "amdgpu", power1_input=15_000_000)
    ledger_file = tmp_path / "ledger.sqlite3"
    loaded = load_model(model_path, EngineSettings(n_ctx=512))
    writer = LedgerWriter(Ledger(ledger_file))
    app = create_app(loaded, ServerSettings(), ledger=writer)
    app.state.worker._meter = EnergyMeter(
        survey(tmp_path, find_nvml=no_nvml).probes, interval=0.005
    )
    server = BackgroundServer(app).start()
    try:
        deadline = time.monotonic() + 120
        while httpx.get(server.url + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.05)
        body = {"prompt": SECRET, "n_predict": 8, "temperature": 0, "ignore_eos": True}
        timings = httpx.post(server.url + "/completion", json=body, timeout=120).json()["timings"]
    finally:
        server.stop()
        loaded.close()
    assert timings["energy_source"] == "amdgpu:hwmon0"
    assert timings["energy_j"] > 0
    assert timings["tokens_per_j"] == pytest.approx(timings["predicted_n"] / timings["energy_j"])
    rows = rows_to_dicts(Ledger(ledger_file).rows())
    assert len(rows) == 1 and rows[0]["energy_j"] == pytest.approx(timings["energy_j"])
