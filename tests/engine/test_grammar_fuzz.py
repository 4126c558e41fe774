"""Generated GBNF grammars and JSON schemas against `localfab serve` in a child process.

Small valid ones, broken ones, and ones far past the limits (deep nesting, huge repetition
bounds, many alternatives): the server never dies and answers every request with 200 or 400.
Each request asks for at most 2 tokens so the run stays near a minute on 2 cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serverproc import ServerProcess, serve

pytestmark = pytest.mark.model

FUZZ = settings(
    max_examples=75,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def server(model_path: Path) -> Iterator[ServerProcess]:
    with serve(model_path, "-c", "2048", "-t", "2") as srv:
        yield srv


def check(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    reply = httpx.post(server.url + path, content=json.dumps(body), timeout=300)
    assert server.alive(), f"the server died on {json.dumps(body)[:500]}: {server.stop()[-2000:]}"
    assert reply.status_code in (200, 400), (reply.status_code, reply.text[:500])
    if reply.status_code == 400:
        assert reply.json()["error"]["type"] == "invalid_request_error"
    return reply


# --- GBNF ---------------------------------------------------------------------------------------

SMALL = st.integers(0, 4)
BOUND = st.one_of(SMALL, SMALL, st.integers(900, 1100), st.integers(10**4, 10**12))


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _repeat(expr: str, lo: int, hi: int | None) -> str:
    return f"{expr}{{{lo},{'' if hi is None else hi}}}"


ATOM = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=6).map(
        _literal
    ),
    st.sampled_from(["[a-z]", "[0-9]", '[^"]', "[\\x00]", "[ -~]", ".", "ws", "word"]),
)


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(inner, min_size=1, max_size=4).map(" ".join),
        st.lists(inner, min_size=2, max_size=4).map(" | ".join),
        inner.map(lambda e: f"({e})"),
        st.tuples(inner, st.sampled_from("*+?")).map(lambda t: f"({t[0]}){t[1]}"),
        st.tuples(inner, BOUND, st.one_of(st.none(), BOUND)).map(
            lambda t: _repeat(f"({t[0]})", t[1], t[2])
        ),
    )


EXPR = st.recursive(ATOM, _extend, max_leaves=12)
RULES = "ws ::= [ \\t\\n]*\nword ::= [a-zA-Z]+\n"


@st.composite
def grammars(draw: st.DrawFn) -> str:
    shape = draw(st.sampled_from(["plain", "plain", "plain", "deep", "wide", "long"]))
    expr = draw(EXPR)
    if shape == "deep":
        depth = draw(
            st.one_of(st.integers(1, 50), st.integers(900, 1100), st.integers(10**4, 10**5))
        )
        expr = "(" * depth + expr + ")" * depth
    elif shape == "wide":
        n = draw(
            st.one_of(st.integers(2, 50), st.integers(4000, 6000), st.integers(10**5, 3 * 10**5))
        )
        expr = " | ".join(_literal(f"w{i}") for i in range(n))
    elif shape == "long":
        expr = _literal("x" * draw(st.integers(1, 400_000)))
    return f"root ::= {expr}\n{RULES}"


@FUZZ
@given(grammar=grammars(), n_predict=st.integers(1, 2), stream=st.booleans())
def test_generated_grammars(server, grammar, n_predict, stream):
    body = {
        "prompt": "Hi",
        "n_predict": n_predict,
        "grammar": grammar,
        "temperature": 0,
        "stream": stream,
    }
    reply = check(server, "/completion", body)
    if stream and reply.status_code == 200:
        # A grammar that dead-ends after a token ends the stream with an error event.
        for line in reply.text.splitlines():
            if line.startswith("data: ") and '"error"' in line:
                assert json.loads(line[6:])["error"]["code"] == 400


# --- JSON schema --------------------------------------------------------------------------------

LEAF = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={"minLength": BOUND, "maxLength": BOUND, "pattern": st.just("^[a-z]{1,3}$")},
    ),
    st.fixed_dictionaries(
        {"type": st.just("string"), "pattern": st.tuples(BOUND, BOUND)},
    ).map(lambda d: {**d, "pattern": f"^(a|b){{{d['pattern'][0]},{d['pattern'][1]}}}$"}),
    st.just({"type": "integer"}),
    st.just({"type": "boolean"}),
    # Large accepted enums cost seconds a token; test_grammar_limits covers where they start.
    st.one_of(st.integers(1, 20), st.integers(1001, 5000)).map(
        lambda n: {"enum": [f"v{i}" for i in range(n)]}
    ),
)


def _schema_extend(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": inner},
            optional={"minItems": BOUND, "maxItems": BOUND},
        ),
        st.dictionaries(st.sampled_from(["a", "b", "name", "x_y"]), inner, max_size=3).map(
            lambda props: {"type": "object", "properties": props, "required": sorted(props)[:1]}
        ),
        st.lists(inner, min_size=1, max_size=3).map(lambda alts: {"anyOf": alts}),
    )


SCHEMA = st.recursive(LEAF, _schema_extend, max_leaves=8)


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    schema = draw(SCHEMA)
    if draw(st.integers(0, 5)) == 0:
        for _ in range(draw(st.one_of(st.integers(1, 20), st.integers(60, 200)))):
            schema = {"type": "object", "properties": {"a": schema}}
    return schema


@FUZZ
@given(schema=schemas(), chat=st.booleans())
def test_generated_json_schemas(server, schema, chat):
    if chat:
        body = {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        }
        check(server, "/v1/chat/completions", body)
    else:
        body = {"prompt": "Hi", "n_predict": 2, "temperature": 0, "json_schema": schema}
        check(server, "/completion", body)
