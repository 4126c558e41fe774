"""`localfab plan` and `localfab doctor` through the installed console script.

The plan for every model on every shipped profile (64 runs) goes through the same command line
in-process (click's test runner on `localfab.cli.cli`): a process each would add only its start.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from localfab.cli import cli
from localfab.machine.probes import load_model_specs, load_profiles
from tests.conftest import LOCALFAB
from tests.gguf_fixtures import write_synthetic

SPECS = load_model_specs()
PROFILES = list(load_profiles())


def lf(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOCALFAB), *args], capture_output=True, text=True, env=env, timeout=120
    )


def lf_in_process(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`localfab ARGS` run in this process, with the home folder and token of `env`."""
    overrides: dict[str, str | None] = {
        "LOCALFAB_HOME": env["LOCALFAB_HOME"],
        "HF_TOKEN": env.get("HF_TOKEN"),
    }
    result = CliRunner().invoke(cli, list(args), env=overrides, prog_name="localfab")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["localfab", *args], result.exit_code, result.stdout, result.stderr
    )


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sparse header-only GGUF files (full size on paper, a few MB on disk) for models.json."""
    folder = tmp_path_factory.mktemp("synthetic")
    return {
        name: write_synthetic(folder / f"{i}.gguf", spec, name=name)
        for i, (name, spec) in enumerate(SPECS.items())
    }


@pytest.mark.parametrize("name", list(SPECS))
def test_plan_prints_a_plan_for_every_profile(
    name: str, model_files: dict[str, Path], lf_env: dict[str, str]
) -> None:
    for profile in PROFILES:
        done = lf_in_process("plan", str(model_files[name]), "--profile", profile, env=lf_env)
        assert done.returncode == 0, (profile, done.stderr)
        out = done.stdout
        assert f"Plan for {name}" in out and f"profile {profile}" in out
        m = re.search(r"GPU layers \(-ngl\)\s+(\d+)/(\d+)", out)
        assert m and int(m.group(2)) == SPECS[name]["n_layer"] + 1
        assert re.search(r"decode speed\s+≈ [\d.]+ tok/s", out)
        assert "Why" in out and "fits                  yes" in out
        if profile == "cuda-build-on-780m":
            assert 'CMAKE_ARGS="-DGGML_VULKAN=on" pip install --force-reinstall' in out
            assert m.group(1) == "0"


def test_plan_json_has_bytes_per_device_and_kind(
    model_files: dict[str, Path], lf_env: dict[str, str]
) -> None:
    path = model_files["Qwen3-8B"]
    done = lf("plan", str(path), "--profile", "rtx3060-laptop-6gb", "--json", env=lf_env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    gpu = data["memory"]["NVIDIA GeForce RTX 3060 Laptop GPU"]
    assert set(gpu) >= {"weights", "kv", "compute", "reserve", "total", "free_left"}
    assert gpu["free_left"] >= 0 and isinstance(gpu["weights"], int)
    assert set(data["memory_by_kind"]) == {"weights", "kv", "compute", "reserve"}
    assert data["machine"]["source"] == "profile:rtx3060-laptop-6gb"
    assert data["settings"]["n_gpu_layers"] == data["n_gpu_layers"]


def test_plan_what_if_sizes_and_overrides(
    model_files: dict[str, Path], lf_env: dict[str, str]
) -> None:
    path = str(model_files["Llama-3.1-8B-Instruct"])
    small = json.loads(
        lf("plan", path, "--vram", "4096", "--ram", "16384", "--json", env=lf_env).stdout
    )
    big = json.loads(
        lf("plan", path, "--vram", "12288", "--ram", "16384", "--json", env=lf_env).stdout
    )
    assert small["n_gpu_layers"] < big["n_gpu_layers"] == 33
    done = lf(
        "plan", path, "--vram", "6144", "--ram", "16384", "-ngl", "12", "-c", "8192", env=lf_env
    )
    assert done.returncode == 0, done.stderr
    assert "What your choices cost" in done.stdout and "-ngl 12" in done.stdout
    both = lf("plan", path, "--profile", "rtx2060-6gb", "--vram", "100", env=lf_env)
    assert both.returncode == 2 and "either --profile or --vram" in both.stderr


def test_plan_errors_are_one_line_with_exit_codes(tmp_path: Path, lf_env: dict[str, str]) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    done = lf("plan", str(text), env=lf_env)
    assert done.returncode == 3 and "not a GGUF file" in done.stderr
    assert "Traceback" not in done.stderr
    unknown = lf("plan", str(text), "--profile", "nope", env=lf_env)
    assert unknown.returncode == 2 and "rtx3060-laptop-6gb" in unknown.stderr


@pytest.mark.model
def test_plan_for_the_embedded_test_model(lf_env: dict[str, str]) -> None:
    done = lf("plan", "gemma3:270m", "--profile", "radeon-780m-512mb", env=lf_env)
    assert done.returncode == 0, done.stderr
    assert "Plan for Gemma 3 270m" in done.stdout and "sliding window" in done.stdout
    assert "prompt processing" in done.stdout  # iGPU advice


def test_doctor_on_this_machine_and_on_a_profile(lf_env: dict[str, str]) -> None:
    here = lf("doctor", env=lf_env)
    assert here.returncode == 0, here.stderr
    assert "llama-cpp-python" in here.stdout and "Advice" in here.stdout
    mismatch = lf("doctor", "--profile", "cuda-build-on-780m", env=lf_env)
    assert "NOT usable" in mismatch.stdout and "-DGGML_VULKAN=on" in mismatch.stdout
    data = json.loads(lf("doctor", "--profile", "rtx3060-laptop-6gb", "--json", env=lf_env).stdout)
    assert data["devices"][0]["usable"] and data["devices"][0]["free"] == 5596 * 1024 * 1024


def test_plan_does_not_mark_the_model_as_used(
    model_files: dict[str, Path], lf_env: dict[str, str]
) -> None:
    # `localfab list` says when a model last ran; reading its header to plan is not a use
    path = str(model_files["Qwen3-8B"])
    added = lf("add", path, "--name", "planned-only", env=lf_env)
    assert added.returncode == 0, added.stderr

    def last_used() -> float | None:
        done = lf("list", "--json", "--no-fit", env=lf_env)
        assert done.returncode == 0, done.stderr
        (entry,) = [e for e in json.loads(done.stdout) if e["name"] == "planned-only"]
        used: float | None = entry["last_used"]
        return used

    before = last_used()
    done = lf("plan", "planned-only", "--profile", "rtx3060-laptop-6gb", env=lf_env)
    assert done.returncode == 0, done.stderr
    assert "Plan for Qwen3-8B" in done.stdout
    assert last_used() == before


def test_plan_places_a_vision_projector_and_says_what_an_image_costs(
    model_files: dict[str, Path], tmp_path: Path, lf_env: dict[str, str]
) -> None:
    from tests.plan.test_plan_projector import MMPROJ

    projector = MMPROJ.write_projector(tmp_path / "mmproj.gguf", 2560)
    path = str(model_files["gemma-3-4b-it"])
    base = ("plan", path, "--profile", "rtx3060-laptop-6gb", "-c", "8192", "--mmproj")
    done = lf_in_process(*base, str(projector), env=lf_env)
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"vision projector mmproj\.gguf: [\d.]+ KiB weights \+ [\d.]+ KiB compute "
        r"on the GPU \(NVIDIA GeForce RTX 3060 Laptop GPU\)",
        done.stdout,
    )
    assert "an image takes 16 tokens of the context (" in done.stdout
    kept = lf_in_process(*base, str(projector), "--no-mmproj-offload", "--json", env=lf_env)
    data = json.loads(kept.stdout)["projector"]
    assert data["device"] == "CPU" and data["image_tokens"] == 16 and data["fits"] is True
    wrong = lf_in_process(*base, path, env=lf_env)
    assert wrong.returncode == 2 and "is not a vision projector" in wrong.stderr
