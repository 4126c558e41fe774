"""`localfab serve`'s options that name a folder, a size or a JSON object, checked and
converted (each error one line naming the flag)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from localfab.errors import UsageError
from localfab.units import MiB

F = TypeVar("F", bound=Callable[..., Any])


def llama_server_options(f: F) -> F:
    """llama-server's flags that its own tests pass and that only serving has:
    --sleep-idle-seconds, --tags, --offline, --ui/--no-ui, --spm-infill."""
    f = click.option(
        "--spm-infill",
        is_flag=True,
        help="/infill prompts in suffix-prefix-middle order (for the models trained so; "
        "default: prefix-suffix-middle).",
    )(f)
    f = click.option(
        "--ui/--no-ui",
        "--webui/--no-webui",
        "web_ui",
        default=None,
        help="Accepted for llama-server's command lines: there is no web UI (localfab chat is the "
        "app); --ui says so.",
    )(f)
    f = click.option(
        "--offline",
        is_flag=True,
        help="Accepted for llama-server's command lines: localfab serve never downloads a model "
        "while it runs (localfab pull does).",
    )(f)
    f = click.option(
        "--tags",
        default="",
        help="Model tags, comma-separated (informational, as llama-server: in /v1/models).",
    )(f)
    f = click.option(
        "--sleep-idle-seconds",
        type=float,
        default=-1,
        help="Free the model (and its KV cache) after this many seconds without work; the next "
        "request loads it again (read-only endpoints answer meanwhile). -1: never.",
    )(f)
    return f


def tool_call_option(f: F) -> F:
    """--tool-call-lenient: small models' bare JSON calls come back as tool_calls."""
    return click.option(
        "--tool-call-lenient",
        "tool_call_lenient",
        is_flag=True,
        help="A reply that is only a JSON tool call without its template's markers (bare, in a "
        "```json block, or left one bracket short), naming an offered tool with arguments that "
        "fit its schema, comes back as tool_calls, as small models write calls (default: "
        "content, as llama-server).",
    )(f)


# llama-server flags that do not apply here, each refused with the reason (never ignored).
# (flags, takes a value, why)
REFUSED: tuple[tuple[tuple[str, ...], bool, str], ...] = (
    (("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"), True,
     "models are not downloaded while serving: `localfab pull REPO` first, then serve it by name "
     "(or serve no model: a router finds the Hugging Face cache's)"),
    (("--embedding", "--embeddings", "--reranking", "--rerank"), False,
     "embeddings and reranking are not served"),
    (("--pooling",), True, "embeddings and reranking are not served"),
    (("--lora", "--lora-scaled"), True, "LoRA adapters are not supported"),
    (("--mmproj-url", "-mmu"), True,
     "models are not downloaded while serving: download the projector, then give --mmproj FILE"),
    (("--tools", "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json"), True,
     "server-side built-in tools and the MCP proxy are left out on purpose (llama-server says "
     "not to enable them where clients are not trusted); `localfab chat` has MCP tools"),
    (("--ui-mcp-proxy",), False, "there is no web UI, nor its MCP proxy"),
    (("--spec-synth-rates", "--spec-synth-len"), True,
     "the synthetic drafter is llama-server's test device; use --spec-type ngram-simple or "
     "draft-simple"),
    (("--grp-attn-n", "-gan", "--grp-attn-w", "-gaw"), True,
     "self-extend is not supported; --context-shift keeps long chats going"),
)  # fmt: skip


def refused_options(f: F) -> F:
    """The llama-server flags in REFUSED, each answered with its reason (exit 2)."""
    for flags, takes_value, why in REFUSED:

        def refuse(ctx: click.Context, param: click.Parameter, value: Any, why: str = why) -> None:
            if value:
                name = max(param.opts, key=len)
                raise click.UsageError(f"{name} does not apply to localfab serve: {why}")

        f = click.option(
            *flags,
            is_flag=not takes_value,
            default=None,
            hidden=True,
            expose_value=False,
            callback=refuse,
        )(f)
    return f


def slot_folder(path: Path | None) -> Path | None:
    """The folder of `--slot-save-path`, which must exist (as llama-server)."""
    if path is not None and not path.is_dir():
        raise UsageError(f"--slot-save-path {path} is not a folder: create it first")
    return path


def template_kwargs(text: str | None) -> tuple[tuple[str, Any], ...]:
    """--chat-template-kwargs: a JSON object of the template's variables."""
    if not text:
        return ()
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--chat-template-kwargs is not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise UsageError(
            '--chat-template-kwargs must be a JSON object, e.g. {"enable_thinking": false}'
        )
    return tuple(value.items())


def cache_disk(mib: int) -> tuple[Path, int] | None:
    """The disk tier's folder and bytes for `--cache-disk MIB`; None when off."""
    if mib < 0:
        raise UsageError(f"--cache-disk must be 0 (off) or a size in MiB, not {mib}")
    if mib == 0:
        return None
    from localfab.config import default_paths

    return default_paths().prompt_cache_dir, mib * MiB


def cache_ram_limit(mib: int | None, planned: int | None = None) -> int | None:
    """Bytes the prompt cache may hold for `--cache-ram MIB` (None: no limit); without the
    flag, what the plan counted for it (`planned`: half the RAM its load leaves free, at most
    llama-server's 8 GiB), or without a plan that share of the RAM free now."""
    if mib is not None:
        if mib < -1:
            raise UsageError(
                f"--cache-ram must be -1 (no limit), 0 (off) or a size in MiB, not {mib}"
            )
        return None if mib == -1 else mib * MiB
    if planned is not None:
        return planned
    from localfab.engine.prompt_cache import default_limit

    return default_limit()


def allowed_origins(given: tuple[str, ...]) -> tuple[str, ...]:
    """Origin patterns from --allowed-origins, else from LOCALFAB_ORIGINS."""
    from localfab.server.edge import ORIGINS_ENV, split_origins

    if not given and os.environ.get(ORIGINS_ENV):
        given = (os.environ[ORIGINS_ENV],)
    # llama-server's `localhost` (only local pages): localhost origins are always allowed.
    given = tuple(",".join(p for p in g.split(",") if p.strip() != "localhost") for g in given)
    return split_origins(given)


def api_keys(given: tuple[str, ...], key_file: str | None) -> tuple[str, ...]:
    """The keys to require: --api-key (else LLAMA_API_KEY), plus those in --api-key-file."""
    from localfab.server.edge import API_KEY_ENV, read_key_file

    keys = list(given)
    if not keys and os.environ.get(API_KEY_ENV, "").strip():
        keys.append(os.environ[API_KEY_ENV].strip())
    if key_file is not None:
        keys += read_key_file(key_file)
    return tuple(dict.fromkeys(keys))


def aip_port(port: int) -> int:
    """Vertex AI's AIP_HTTP_PORT in its prediction mode (AIP_MODE=PREDICTION), else `port`."""
    from localfab.server.gcp import port as gcp_port

    chosen = gcp_port(port)
    if chosen != port:
        click.echo(f"localfab: AIP_MODE: listening on AIP_HTTP_PORT {chosen}", err=True)
    return chosen


def is_loopback(host: str) -> bool:
    """Whether binding `host` (or each of a comma-separated list) only accepts connections
    from this machine."""
    import ipaddress
    import socket

    if "," in host:
        return all(is_loopback(h.strip()) for h in host.split(","))
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(host, None)
            )
        except (OSError, ValueError):
            return False


def local_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches a server listening on host:port at."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
