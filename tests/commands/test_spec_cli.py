"""Speculative decoding from `localfab run` and config.toml: flags, the [speculative] table,
bad input, and what -v and --json report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from localfab.config import Config, default_paths
from localfab.errors import UsageError
from localfab.runtime import speculation_from
from tests.conftest import LOCALFAB

PROMPT = (
    "Rewrite the following text exactly, but change the name Thomas to Peter: The old "
    "lighthouse stood on the rocky point for more than a century. Its keeper, a quiet man "
    "named Thomas, climbed the spiral stairs every evening to light the lamp."
)


def lf(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args], input="", capture_output=True, text=True, env=env, timeout=300
    )


def one_error(proc: subprocess.CompletedProcess[str], code: int, needle: str) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("localfab: error:")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def write_config(env: dict[str, str], text: str) -> None:
    paths = default_paths(env)
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text(text, encoding="utf-8")


# --- settings, without the model ---------------------------------------------------------------


def test_flags_win_over_the_config_table() -> None:
    config = Config(speculative=(("spec_type", "ngram-simple"), ("draft_max", 8)))
    spec = speculation_from(config)
    assert spec is not None and (spec.spec_type, spec.draft_max) == ("ngram-simple", 8)
    spec = speculation_from(config, draft_max=32, draft_min=2)
    assert spec is not None and (spec.draft_max, spec.draft_min) == (32, 2)
    assert speculation_from(config, spec_type="none") is None
    assert speculation_from(Config()) is None


def test_exactness_can_be_traded_for_longer_drafts() -> None:
    spec = speculation_from(Config(), spec_type="ngram-simple")
    assert spec is not None and spec.exact
    config = Config(speculative=(("spec_type", "ngram-simple"), ("spec_exact", False)))
    spec = speculation_from(config)
    assert spec is not None and not spec.exact
    spec = speculation_from(config, spec_exact=True)
    assert spec is not None and spec.exact


def test_a_draft_model_alone_means_draft_simple(tmp_path: Path) -> None:
    spec = speculation_from(Config(), model_draft=str(tmp_path / "d.gguf"), gpu_layers_draft=0)
    assert spec is not None and spec.spec_type == "draft-simple"
    assert spec.n_gpu_layers_draft == 0


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ({"spec_type": "ngram-simple", "draft_max": 0}, "--draft-max must be 1 to 64"),
        ({"spec_type": "ngram-simple", "draft_max": 65}, "--draft-max must be 1 to 64"),
        ({"spec_type": "draft-simple"}, "needs a draft model"),
        ({"spec_type": "ngram-simple", "model_draft": "d.gguf"}, "needs --spec-type draft"),
        ({"spec_type": "ngram-simple", "draft_p_min": 2.0}, "--draft-p-min"),
    ],
)
def test_bad_flags_are_usage_errors(flags: dict[str, object], needle: str) -> None:
    with pytest.raises(UsageError, match=needle):
        speculation_from(Config(), **flags)  # type: ignore[arg-type]


def test_the_speculative_table_is_read_and_checked(tmp_path: Path) -> None:
    env = {"LOCALFAB_HOME": str(tmp_path)}
    write_config(env, '[speculative]\nspec_type = "ngram-simple"\ndraft_max = 12\n')
    config = Config.load(default_paths(env), env=env)
    assert dict(config.speculative) == {"spec_type": "ngram-simple", "draft_max": 12}
    for bad, needle in (
        ("draft_max = 0", "speculative.draft_max must be 1 to 64"),
        ('spec_type = "eagle"', "speculative.spec_type must be one of"),
        ("draft_maxx = 3", "unknown setting speculative.draft_maxx"),
        ('draft_max = "many"', "must be a whole number"),
    ):
        write_config(env, f"[speculative]\n{bad}\n")
        with pytest.raises(UsageError, match=needle):
            Config.load(default_paths(env), env=env)
    write_config(env, 'speculative = "on"\n')
    with pytest.raises(UsageError, match="speculative must be a table"):
        Config.load(default_paths(env), env=env)


def test_bad_draft_max_on_the_command_line_is_one_line(lf_env: dict[str, str]) -> None:
    for value in ("0", "65"):
        proc = lf(
            ["run", "no-such-model", "hi", "--spec-type", "ngram-simple", "--draft-max", value],
            lf_env,
        )
        one_error(proc, 2, "--draft-max must be 1 to 64")


# --- on the real model -------------------------------------------------------------------------


def run_json(
    model_path: Path, env: dict[str, str], *extra: str, prompt: str = PROMPT
) -> tuple[dict[str, Any], str]:
    proc = lf(
        [
            "run",
            str(model_path),
            prompt,
            "--temp",
            "0",
            "-n",
            "60",
            "--json",
            "-v",
            "--no-ledger",
            *extra,
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


# Past the 256 cells where one token's attention over an f16 cache is split over the threads.
LONG_PROMPT = PROMPT + (
    " Ships passing in the night relied on its steady beam to avoid the dangerous reef below. "
    "In winter the storms were fierce, and waves crashed against the walls, but the light never "
    "failed. The villagers often brought Thomas bread and fish, and in return he told them "
    "stories about the ships he had seen. One night a small boat lost its way in the fog, and "
    "Thomas rang the great bell until the sailors found the harbor. The next morning the "
    "fishermen came to thank him, carrying baskets of apples and a bottle of wine from the "
    "valley. Thomas smiled and said that the sea had been kind to them all. Years later, when "
    "the lighthouse was replaced by an automatic beacon, the villagers kept the old lamp in the "
    "church as a reminder of the man who had watched over them. Children still climb the hill "
    "on summer evenings to look at the tower, and their grandparents tell them how the keeper "
    "never missed a single night in forty years. The stones of the tower are grey and worn, and "
    "moss grows between them, yet the building stands as firmly as ever against the wind."
)


def same_load_without_drafts(
    model_path: Path, env: dict[str, str], prompt: str
) -> tuple[dict[str, Any], str]:
    """Plain decoding on the load that exact speculation makes (its kernels and KV cache): with
    --draft-min 64 only a 64-token draft is verified, which a 60-token reply never has."""
    plain, err = run_json(
        model_path, env, "--spec-type", "ngram-simple", "--draft-max", "64", "--draft-min", "64",
        prompt=prompt,
    )  # fmt: skip
    assert "draft_n" not in plain["timings"]
    return plain, err


@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["short", "past-256"])
def test_run_with_ngram_speculation_gives_the_same_text(
    model_path: Path, lf_env: dict[str, str], prompt: str
) -> None:
    plain, plain_err = same_load_without_drafts(model_path, lf_env, prompt)
    fast, err = run_json(
        model_path, lf_env, "--spec-type", "ngram-simple", "--draft-max", "8", prompt=prompt
    )
    assert fast["text"] == plain["text"]
    t = fast["timings"]
    assert t["draft_n"] > 20 and 0 < t["draft_n_accepted"] <= t["draft_n"]
    assert t["prompt_n"] > (256 if prompt is LONG_PROMPT else 0)
    # Exact speculation on the CPU loads one-token kernels for batches and a q8_0 K cache.
    for said in (err, plain_err):
        assert "exact speculative decoding: loading with one-token kernels" in said
        assert "KV cache K q8_0, V f16 (planned: f16)" in said
    assert "speculative decoding with ngram-simple, up to 8 tokens per step" in err
    assert f"{t['draft_n']} tokens drafted, {t['draft_n_accepted']} accepted (acceptance" in err
    assert "nothing drafted (the reply did not repeat its input)" in plain_err


def test_a_cache_type_the_user_gave_stays_and_bounds_the_drafts(
    model_path: Path, lf_env: dict[str, str]
) -> None:
    # -ctk/-ctv f16: no draft is verified past 256 tokens of context, and -v says why.
    fast, err = run_json(
        model_path, lf_env, "--spec-type", "ngram-simple", "-ctk", "f16", "-ctv", "f16",
        prompt=LONG_PROMPT,
    )  # fmt: skip
    assert "draft_n" not in fast["timings"] and fast["text"]
    assert "KV cache q8_0" not in err and "one-token kernels" in err
    assert "none past them" in err
    assert "nothing drafted (the reply did not repeat its input, or its context was past" in err


def test_the_config_table_turns_speculation_on(model_path: Path, lf_env: dict[str, str]) -> None:
    write_config(lf_env, '[speculative]\nspec_type = "ngram-simple"\n')
    fast, err = run_json(model_path, lf_env)
    assert fast["timings"]["draft_n"] > 0 and "acceptance" in err


def test_a_draft_model_that_cannot_be_used_leaves_speculation_off(
    model_path: Path, lf_env: dict[str, str], tmp_path: Path
) -> None:
    missing, err = run_json(model_path, lf_env, "-md", str(tmp_path / "nope.gguf"))
    assert "running without speculative decoding:" in err and "nope.gguf" in err
    assert missing["text"] and "draft_n" not in missing["timings"]
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    _, err = run_json(model_path, lf_env, "-md", str(corrupt))
    assert "running without speculative decoding:" in err


def test_the_test_model_as_its_own_draft(model_path: Path, lf_env: dict[str, str]) -> None:
    plain, _ = same_load_without_drafts(model_path, lf_env, PROMPT)
    fast, err = run_json(
        model_path, lf_env, "-md", str(model_path), "--draft-p-min", "0", "-ngld", "0"
    )
    assert fast["text"] == plain["text"]
    assert "speculative decoding with draft model" in err
    assert fast["timings"]["draft_n_accepted"] > 0
