"""config.toml and LOCALFAB_* values: wrong types, non-finite numbers, out-of-range values and
thread counts are one clear error each, never a traceback or a crash in llama.cpp."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from localfab.config import MAX_THREADS, Config, Paths, check_threads, default_paths
from localfab.errors import UsageError
from localfab.runtime import wishes_from_options
from tests.conftest import LOCALFAB
from tests.store.test_store import write_tiny_gguf


@pytest.fixture()
def paths(tmp_path: Path) -> Paths:
    return default_paths({"LOCALFAB_HOME": str(tmp_path / "home")})


def write_config(paths: Paths, text: str) -> None:
    paths.config_file.parent.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(text)


def lf(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args], env=env, input="", capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("max_tokens = 1e400", "config.toml: max_tokens must be a whole number, not inf"),
        ("max_tokens = 2.5", "max_tokens must be a whole number"),
        ("max_tokens = 0", "max_tokens must be -1 (no limit) or a positive number"),
        ("max_tokens = -7", "max_tokens must be -1"),
        ('temperature = "nan"', "config.toml: temperature must be a finite number, not nan"),
        ("temperature = nan", "temperature must be a finite number"),
        ("temperature = inf", "temperature must be a finite number"),
        ("temperature = -1.0", "temperature must be a number from 0"),
        ("top_p = 1.5", "top_p must be a number from 0 to 1"),
        ("top_k = true", "top_k must be a whole number"),
        ("threads = -5", "config.toml: threads must be 1 to 512, or 0 or -1"),
        ("threads = 100000", "threads must be 1 to 512"),
        ('flash_attn = "maybe"', "flash_attn must be auto, on or off"),
        ('image_previews = "sixels"', "image_previews must be auto, halfcell or off, not sixels"),
        ("ctx_size = [1]", "ctx_size must be a whole number"),
    ],
)
def test_bad_config_values_are_one_usage_error(paths: Paths, toml: str, needle: str) -> None:
    write_config(paths, toml + "\n")
    with pytest.raises(UsageError) as err:
        Config.load(paths, env={})
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("var", "value", "needle"),
    [
        ("LOCALFAB_THREADS", "-2", "LOCALFAB_THREADS: threads must be 1 to 512"),
        ("LOCALFAB_TEMPERATURE", "nan", "LOCALFAB_TEMPERATURE: temperature must be a finite"),
        ("LOCALFAB_MAX_TOKENS", "1e400", "LOCALFAB_MAX_TOKENS: max_tokens must be a whole"),
        ("LOCALFAB_TOP_P", "inf", "top_p must be a finite number"),
    ],
)
def test_bad_environment_values_name_the_variable(
    paths: Paths, var: str, value: str, needle: str
) -> None:
    with pytest.raises(UsageError) as err:
        Config.load(paths, env={var: value})
    assert needle in str(err.value)


def test_good_values_still_load(paths: Paths) -> None:
    write_config(
        paths,
        "max_tokens = 256\ntemperature = 0\ntop_p = 1.0\nthreads = -1\nmin_p = 0.1\n"
        'flash_attn = "ON"\nmax_continues = 2.0\n',
    )
    config = Config.load(paths, env={"LOCALFAB_TOP_K": "20"})
    assert (config.max_tokens, config.temperature, config.top_p, config.threads) == (
        256,
        0.0,
        1.0,
        -1,
    )
    assert (config.top_k, config.flash_attn, config.max_continues) == (20, "on", 2)


def test_check_threads_is_the_one_rule() -> None:
    assert check_threads(None) == check_threads(0) == check_threads(-1) == 0
    assert check_threads(1) == 1 and check_threads(MAX_THREADS) == MAX_THREADS
    for bad in (-2, -5, MAX_THREADS + 1, 10**9):
        with pytest.raises(UsageError, match="must be 1 to 512, or 0 or -1"):
            check_threads(bad)


def test_wishes_map_minus_one_to_auto_and_refuse_other_negatives() -> None:
    config = Config(threads=6)
    assert wishes_from_options(config).threads == 6
    assert wishes_from_options(config, threads=-1).threads is None  # explicit auto wins
    assert wishes_from_options(config, threads=3).threads == 3
    assert wishes_from_options(Config(threads=-1)).threads is None
    with pytest.raises(UsageError, match="-t/--threads must be"):
        wishes_from_options(config, threads=-5)
    with pytest.raises(UsageError, match="threads must be"):
        wishes_from_options(Config(threads=-3))


# through the installed console script ----------------------------------------------------------
def test_cli_reports_bad_config_as_one_line(lf_env: dict[str, str], tmp_path: Path) -> None:
    paths = default_paths(lf_env)
    model = write_tiny_gguf(tmp_path / "m.gguf")
    for toml in ("max_tokens = 1e400", 'temperature = "nan"', "threads = -5"):
        write_config(paths, toml + "\n")
        proc = lf(lf_env, "run", str(model), "Hi", "-n", "2")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("localfab: error: ") and "config.toml" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [["-t", "-5"], ["-t", "-2"], ["--threads", "100000"]])
def test_cli_refuses_bad_thread_counts_before_loading(
    lf_env: dict[str, str], tmp_path: Path, args: list[str]
) -> None:
    model = write_tiny_gguf(tmp_path / "m.gguf")
    proc = lf(lf_env, "run", str(model), "Hi", "-n", "2", *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("localfab: error: -t/--threads must be 1 to 512")
    env = dict(lf_env, LOCALFAB_THREADS="-2")
    proc = lf(env, "run", str(model), "Hi", "-n", "2")
    assert proc.returncode == 2 and "LOCALFAB_THREADS" in proc.stderr, proc.stderr


def test_serve_refuses_bad_thread_counts(lf_env: dict[str, str], tmp_path: Path) -> None:
    model = write_tiny_gguf(tmp_path / "m.gguf")
    proc = lf(lf_env, "serve", "-m", str(model), "-t", "-5", "--port", "0")
    assert proc.returncode == 2, proc.stderr
    assert "localfab: error: -t/--threads must be" in proc.stderr
    write_config(default_paths(lf_env), "threads = -5\n")
    proc = lf(lf_env, "serve", "-m", str(model), "--port", "0")
    assert proc.returncode == 2 and "config.toml: threads" in proc.stderr, proc.stderr


# the engine's last guard -----------------------------------------------------------------------
@pytest.mark.model
def test_engine_refuses_bad_thread_counts_and_takes_minus_one_as_auto(model_path: Path) -> None:
    from localfab.engine import Engine, EngineSettings

    for bad in (-5, -2, MAX_THREADS + 1):
        with pytest.raises(UsageError, match="n_threads must be"):
            Engine(model_path, EngineSettings(n_ctx=256, n_threads=bad))
    with pytest.raises(UsageError, match="n_threads_batch must be"):
        Engine(model_path, EngineSettings(n_ctx=256, n_threads_batch=-4))
    engine = Engine(model_path, EngineSettings(n_ctx=256, n_threads=-1))
    try:
        assert engine.n_threads >= 1 and engine.n_threads_batch == engine.n_threads
    finally:
        engine.close()


def test_the_ledger_setting_is_a_boolean_from_the_file_or_the_environment(paths: Paths) -> None:
    assert Config.load(paths, env={}).ledger is True
    write_config(paths, "ledger = false\n")
    assert Config.load(paths, env={}).ledger is False
    assert Config.load(paths, env={"LOCALFAB_LEDGER": "on"}).ledger is True
    assert Config.load(paths, env={"LOCALFAB_LEDGER": "0"}).ledger is False
    with pytest.raises(
        UsageError, match="LOCALFAB_LEDGER: ledger must be true or false, not maybe"
    ):
        Config.load(paths, env={"LOCALFAB_LEDGER": "maybe"})
    write_config(paths, 'ledger = "yes please"\n')
    with pytest.raises(UsageError, match="ledger must be true or false"):
        Config.load(paths, env={})
