"""What remote servers serve: their models from `/v1/models`, as the models screen's remote tab
and `localfab remote list` show them."""

from __future__ import annotations

from dataclasses import dataclass

from localfab.errors import LocalfabError
from localfab.remote.client import Remote, RemoteClient
from localfab.units import format_context


@dataclass(frozen=True)
class RemoteRow:
    """A model a remote server serves, as the models screen lists it; a server that could not
    be listed is one row with no model and the reason in `detail`."""

    server: str  # the remote's name ([remotes.NAME]) or URL
    model: str
    detail: str
    choice: str = ""  # what the app opens for it ("model@server"; "": nothing to open)


def remote_rows(label: str, remote: Remote) -> list[RemoteRow]:
    """What one server says it serves: its models, with their context where it says it."""
    client = RemoteClient(remote)
    try:
        listed = client.get("/v1/models")
    except LocalfabError as exc:
        return [RemoteRow(label, "", str(exc))]
    finally:
        client.close()
    data = listed.get("data") if isinstance(listed, dict) else None
    rows = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict) or not item.get("id"):
            continue
        model = str(item["id"])
        meta = item.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        context = item.get("max_model_len") or meta.get("n_ctx_train") or meta.get("n_ctx")
        detail = f"context {format_context(int(context))}" if isinstance(context, int) else ""
        owner = str(item.get("owned_by") or "")
        detail = " · ".join(part for part in (detail, owner) if part)
        rows.append(RemoteRow(label, model, detail, f"{model}@{label}"))
    return rows or [RemoteRow(label, "", "the server lists no models (/v1/models)")]
