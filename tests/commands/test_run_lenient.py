"""`localfab run --tools` through the installed console script: a reply that is only a bare
JSON call, one brace short (as small models write them), is printed as the call's JSON line,
not as text. The test model is made to write it as in `tests/server/test_tools_lenient.py`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.commands.test_run_cli import lf
from tests.engine.test_toolcalls import WEATHER
from tests.server.test_tools_lenient import CALL, LINE, PLAIN


def test_a_bare_call_is_printed_as_a_call(model_path: Path, lf_env: dict[str, str], tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER]), encoding="utf-8")
    plain = tmp_path / "plain.jinja"
    plain.write_text(PLAIN, encoding="utf-8")
    base = ["run", str(model_path), (LINE + "\n") * 6, "--chat-template-file", str(plain)]
    base += ["--stop", "}\n", "-n", "40", "--temperature", "0", "--no-ledger"]
    with_tools = [*base, "--tools", str(tools)]
    printed = lf(with_tools, lf_env)
    assert printed.returncode == 0, printed.stderr
    # The call's JSON line only: the model's text (LINE but its last brace) is not printed.
    assert printed.stdout.splitlines() == [json.dumps(CALL)], printed.stdout
    whole = json.loads(lf([*with_tools, "--json"], lf_env).stdout)
    assert (whole["text"], whole["finish_reason"]) == ("", "tool_calls")
    assert whole["tool_calls"] == [CALL]
