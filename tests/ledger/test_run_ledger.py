"""`localfab run` writes the usage ledger: real generations on the test model."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from localfab.engine.types import GenerationOptions
from localfab.ledger.writer import Ledger, TokenClock, build_row, rows_to_dicts
from localfab.machine.energy import EnergyMeter, survey
from tests.conftest import LOCALFAB
from tests.machine.test_energy import hwmon

pytestmark = pytest.mark.model

SECRET = "zebra quokka 7731 marmalade"


def lf(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args], input="", capture_output=True, text=True, env=env, timeout=300
    )


def ledger_of(env: dict[str, str]) -> Ledger:
    return Ledger(Path(env["LOCALFAB_HOME"]) / "data" / "ledger.sqlite3")


def run_args(model: Path, *extra: str) -> list[str]:
    return ["run", str(model), SECRET, "-n", "6", "--temp", "0", "-c", "512", *extra]


def test_run_records_rows_without_the_text(model_path: Path, lf_env: dict[str, str]) -> None:
    proc = lf(run_args(model_path, "--json"), lf_env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    timings = result["timings"]
    assert {"energy_j", "tokens_per_j", "energy_source"} <= set(timings)
    proc = lf(run_args(model_path, "-v"), lf_env)
    assert proc.returncode == 0, proc.stderr
    assert "localfab: energy" in proc.stderr
    ledger = ledger_of(lf_env)
    rows = rows_to_dicts(ledger.rows())
    assert len(rows) == 2
    first = rows[0]
    assert first["frontend"] == "run" and first["model"] == str(model_path)
    assert first["prompt_tokens"] == result["usage"]["prompt_tokens"]
    assert first["generated_tokens"] == result["usage"]["completion_tokens"] == 6
    assert first["n_ctx"] == 512 and first["type_k"] == "f16"
    assert first["decode_tok_s"] > 0 and first["itl_p99_ms"] >= first["itl_p50_ms"] > 0
    assert first["ttft_ms"] > 0
    assert first["peak_memory"]["ram"] > 100 * 2**20
    assert first["model_size"] == model_path.stat().st_size
    if timings["energy_j"] is None:
        assert first["energy_j"] is None and first["energy_note"]
    # The request's text is in no file of the ledger.
    for path in ledger.path.parent.glob("ledger.sqlite3*"):
        assert SECRET.encode() not in path.read_bytes()
        assert b"quokka" not in path.read_bytes()


def test_no_ledger_flag_and_setting(model_path: Path, lf_env: dict[str, str]) -> None:
    assert lf(run_args(model_path, "--no-ledger"), lf_env).returncode == 0
    env = dict(lf_env, LOCALFAB_LEDGER="off")
    assert lf(run_args(model_path), env).returncode == 0
    assert ledger_of(lf_env).rows() == []


def test_locked_ledger_never_fails_the_reply(model_path: Path, lf_env: dict[str, str]) -> None:
    ledger = ledger_of(lf_env)
    assert lf(run_args(model_path), lf_env).returncode == 0
    holder = sqlite3.connect(ledger.path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        proc = lf(run_args(model_path, "-v"), lf_env)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "not recorded in the ledger" in proc.stderr and "locked" in proc.stderr
    assert len(ledger.rows()) == 1
    stats = lf(["stats"], lf_env)
    assert "1 repl(ies) were not recorded" in stats.stdout


def test_kill_during_a_reply_keeps_earlier_rows(model_path: Path, lf_env: dict[str, str]) -> None:
    for _ in range(2):
        assert lf(run_args(model_path), lf_env).returncode == 0
    proc = subprocess.Popen(
        [str(LOCALFAB), "run", str(model_path), "1, 2, 3, 4, 5, 6, 7,", "-n", "4000", "--raw"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=lf_env,
    )
    try:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        deadline = time.monotonic() + 120
        seen = b""
        while len(seen) < 8:  # the reply is streaming
            assert time.monotonic() < deadline, "no reply streamed"
            assert proc.poll() is None, "the reply ended before it could be killed"
            seen += proc.stdout.read() or b""
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    ledger = ledger_of(lf_env)
    conn = sqlite3.connect(ledger.path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert len(ledger.rows()) == 2
    assert lf(run_args(model_path), lf_env).returncode == 0
    assert len(ledger.rows()) == 3


def test_sampled_power_wraps_a_real_generation(engine: object, tmp_path: Path) -> None:
    """A power-only source (15 W amdgpu) sampled around a real reply on the test model."""
    from localfab.engine import Done, Engine, EngineSettings, SamplingParams

    assert isinstance(engine, Engine)
    hwmon(tmp_path, 0, "amdgpu", power1_input=15_000_000)
    meter = EnergyMeter(survey(tmp_path, find_nvml=lambda: None).probes, interval=0.01)
    clock = TokenClock()
    done = None
    tokens = engine.tokenize("Once upon a time")
    with meter.measure() as measured:
        start = time.monotonic()
        for event in engine.stream(tokens, max_tokens=12, sampling=SamplingParams.greedy()):
            if isinstance(event, Done):
                done = event
            else:
                clock.tick(time.perf_counter())
        elapsed = time.monotonic() - start
    assert done is not None
    energy = measured.energy
    assert energy.source == "amdgpu:hwmon0"
    assert energy.joules is not None and 0 < energy.joules <= 15.0 * (elapsed + 1.0)
    row = build_row(
        frontend="chat",
        model="gemma",
        plan=EngineSettings(n_ctx=2048),
        timings=done.timings,
        prompt_tokens=len(tokens),
        generated_tokens=done.completion_tokens,
        clock=clock,
        energy=energy,
    )
    assert row.tokens_per_j == pytest.approx(done.completion_tokens / energy.joules)
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    assert ledger.record(row)
    stored = ledger.rows()[0]
    assert stored["energy_source"] == "amdgpu:hwmon0" and stored["energy_j"] == energy.joules


def test_reply_recorder_around_a_chat_session(engine: object, tmp_path: Path) -> None:
    """The chat app's hook: a ChatSession reply on the real model, its events unchanged, one
    row written by the background writer, with sampled energy from a fake 10 W source."""
    from localfab.chat.prompt import PromptBuilder
    from localfab.chat.session import ChatSession, Reply
    from localfab.engine import Engine, EngineSettings, SamplingParams, TokenEvent
    from localfab.ledger.writer import LedgerWriter, ReplyRecorder

    assert isinstance(engine, Engine)

    hwmon(tmp_path, 0, "amdgpu", power1_average=10_000_000)
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    writer = LedgerWriter(ledger)
    recorder = ReplyRecorder(
        writer,
        frontend="chat",
        model="gemma",
        plan=EngineSettings(n_ctx=2048, n_batch=512),
        meter=EnergyMeter(survey(tmp_path, find_nvml=lambda: None).probes, interval=0.01),
    )
    session = ChatSession(engine, PromptBuilder(engine), max_continues=0)
    for turn in ("Hello", "Tell me more"):
        events = list(
            recorder.wrap(
                session.send(
                    turn, GenerationOptions(max_tokens=8, sampling=SamplingParams.greedy())
                )
            )
        )
        reply = events[-1]
        assert isinstance(reply, Reply)
        text = "".join(e.text for e in events if isinstance(e, TokenEvent))
        assert text == reply.text
        assert recorder.energy is not None and recorder.energy.source == "amdgpu:hwmon0"
        assert recorder.row is not None and recorder.row.generated_tokens == 8
    writer.close()
    rows = ledger.rows()
    assert [(r["frontend"], r["generated_tokens"]) for r in rows] == [("chat", 8), ("chat", 8)]
    assert rows[1]["cached_tokens"] > 0  # the second turn reused the first turn's KV cache
    assert all(r["energy_j"] > 0 and r["tokens_per_j"] > 0 for r in rows)
