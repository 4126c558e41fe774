"""The router's model sources, as llama-server's router reads them: the Hugging Face cache,
--models-dir, --models-preset (INI) and dedup-cache-models; and the flags its models get."""

from __future__ import annotations

from pathlib import Path

import pytest

from localfab.commands.serve_router import child_args
from localfab.errors import UsageError
from localfab.server.router_models import (
    dedup,
    file_tag,
    read_preset,
    resolve_hf,
    scan_cache,
    scan_models_dir,
)

COMMIT = "0" * 39 + "1"


def cached(cache: Path, repo: str, *names: str) -> None:
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    for name in names:
        (snapshot / name).write_bytes(b"GGUF")


def test_tags_as_llama_cpp_reads_them() -> None:
    assert file_tag("Qwen3-8B-Q4_K_M.gguf") == "Q4_K_M"
    assert file_tag("stories260K-f32.gguf") == "F32"
    assert file_tag("model.q8_0.gguf") == "Q8_0"
    assert file_tag("big-Q4_K_M-00001-of-00003.gguf") == "Q4_K_M"
    assert file_tag("big-Q4_K_M-00002-of-00003.gguf") is None  # not the first part


def test_the_hugging_face_cache(tmp_path: Path) -> None:
    cached(tmp_path, "org/model-GGUF", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-F16.gguf")
    cached(tmp_path, "org/other", "other-F16.gguf")
    found = scan_cache(tmp_path)
    assert sorted(found) == ["org/model-GGUF:Q4_K_M", "org/model-GGUF:Q8_0", "org/other:F16"]
    assert all(m.source == "cache" for m in found.values())
    # Without a tag: Q4_K_M first, then Q8_0, then any.
    assert resolve_hf("org/model-GGUF", tmp_path) == found["org/model-GGUF:Q4_K_M"].path
    assert resolve_hf("org/model-GGUF:q8_0", tmp_path) == found["org/model-GGUF:Q8_0"].path
    assert resolve_hf("org/other", tmp_path) == found["org/other:F16"].path
    assert resolve_hf("org/missing", tmp_path) is None


def test_a_models_folder(tmp_path: Path) -> None:
    (tmp_path / "small.gguf").write_bytes(b"GGUF")
    (tmp_path / "mmproj-small.gguf").write_bytes(b"GGUF")
    vision = tmp_path / "vision"
    vision.mkdir()
    for name in ("vision-Q4_K_M.gguf", "mmproj-vision-F16.gguf"):
        (vision / name).write_bytes(b"GGUF")
    split = tmp_path / "split"
    split.mkdir()
    for part in ("00002", "00001"):
        (split / f"m-{part}-of-00002.gguf").write_bytes(b"GGUF")
    found = scan_models_dir(tmp_path)
    assert sorted(found) == ["small", "split", "vision"]
    assert found["vision"].path == vision / "vision-Q4_K_M.gguf"
    assert found["split"].path == split / "m-00001-of-00002.gguf"
    with pytest.raises(UsageError, match="does not exist"):
        scan_models_dir(tmp_path / "nowhere")


def test_a_preset_file(tmp_path: Path) -> None:
    cached(tmp_path, "org/chat", "chat-Q4_K_M.gguf")
    preset = tmp_path / "models.ini"
    preset.write_text(
        "; models for the editor and the chat\n"
        "[*]\n"
        "c = 4096\n"
        "[coder]\n"
        "model = /models/coder.gguf\n"
        "alias = code, fim\n"
        "flash-attn = on  # inline comment\n"
        "no-context-shift = true\n"
        "[chat]\n"
        "hf-repo = org/chat\n"
        "c = 8192\n"
        "load-on-startup = 1\n"
        "jinja = false\n"
    )
    found = read_preset(preset, tmp_path, {})
    coder, chat = found["coder"], found["chat"]
    assert coder.path == Path("/models/coder.gguf") and coder.aliases == ("code", "fim")
    assert coder.args == ["-c", "4096", "--flash-attn", "on", "--no-context-shift"]
    assert chat.hf_repo == "org/chat" and chat.path is None and chat.load_on_startup
    assert chat.args == ["-c", "8192", "--no-jinja"]
    preset.write_text("[broken]\nc = 512\n")
    with pytest.raises(UsageError, match=r"\[broken\] names no model"):
        read_preset(preset, tmp_path, {})


def test_dedup_hides_the_cache_entries_a_preset_serves(tmp_path: Path) -> None:
    cached(tmp_path, "org/main", "main-F32.gguf")
    cached(tmp_path, "org/draft", "draft-F32.gguf")
    cached(tmp_path, "org/else", "else-Q8_0.gguf")
    preset = tmp_path / "p.ini"
    preset.write_text(
        "[both]\nhf-repo = org/main\nspec-draft-hf = org/draft\ndedup-cache-models = 1\n"
    )
    models = scan_cache(tmp_path)
    models.update(read_preset(preset, tmp_path, models))
    dedup(models, tmp_path)
    hidden = sorted(name for name, m in models.items() if m.hidden)
    assert hidden == ["org/draft:F32", "org/main:F32"]
    assert models["both"].args[-2:] == ["-md", str(models["org/draft:F32"].path)]


def test_a_models_server_gets_the_routers_flags_less_its_own() -> None:
    argv = [
        "--models-dir", "/m", "--models-max=2", "--host", "0.0.0.0", "--port", "8080",
        "--api-key", "k", "--no-models-autoload", "-c", "2048", "--temp", "0.5",
    ]  # fmt: skip
    assert child_args(argv) == ["-c", "2048", "--temp", "0.5", "--cache-ram", "0"]
    assert child_args(["-cram", "512"]) == ["-cram", "512"]
