"""`localfab doctor` lists power sources and the ledger's state (installed command)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from localfab.ledger.writer import Ledger
from tests.conftest import LOCALFAB
from tests.ledger.test_ledger import row


def test_doctor_power_and_ledger_sections(lf_env: dict[str, str]) -> None:
    ledger = Ledger(Path(lf_env["LOCALFAB_HOME"]) / "data" / "ledger.sqlite3")
    assert ledger.record(row()) and ledger.record(row())
    proc = subprocess.run(
        [str(LOCALFAB), "doctor"], capture_output=True, text=True, env=lf_env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "Power sources" in proc.stdout
    assert "Usage ledger" in proc.stdout and "2 replies recorded" in proc.stdout
    proc = subprocess.run(
        [str(LOCALFAB), "doctor", "--json"], capture_output=True, text=True, env=lf_env, timeout=120
    )
    data = json.loads(proc.stdout)
    assert data["ledger"]["rows"] == 2 and data["ledger"]["error"] is None
    assert data["power"], "every machine has at least a finding (NVML at the least)"
    assert all({"source", "ok", "detail", "fix"} <= set(f) for f in data["power"])
