"""Limits on grammars and JSON schemas (no model): hostile input is refused, real input passes."""

from __future__ import annotations

import pytest

from localfab.engine.grammar import limits as gl
from localfab.engine.grammar.convert import builtin_grammars, json_schema_to_gbnf
from localfab.engine.grammar.limits import GrammarLimitError, check_grammar, check_schema
from localfab.engine.sampling import penalty_window
from localfab.errors import UsageError
from localfab.server.errors import ApiError
from localfab.server.params import parse_generation
from localfab.server.settings import ServerSettings

NESTED = "root ::= " + "(" * 100_000 + '"a"' + ")" * 100_000
HUGE = "root ::= " + " | ".join(f'"w{i}"' for i in range(600_000))

# A typical OpenAI structured-output schema: nested objects, arrays, enums, $defs, formats.
TYPICAL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 100},
        "email": {"type": "string", "pattern": "^[a-z0-9.]{1,64}@[a-z0-9.]{1,64}$"},
        "id": {"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 10},
        "address": {"$ref": "#/$defs/address"},
        "history": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"date": {"type": "string", "format": "date"}},
                "required": ["date"],
            },
        },
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
        }
    },
}


def refused(fn, arg) -> str:
    with pytest.raises(GrammarLimitError) as info:
        fn(arg)
    return str(info.value)


# --- GBNF ---------------------------------------------------------------------------------------


def test_deeply_nested_grammar_names_its_depth_and_the_limit():
    message = refused(check_grammar, NESTED)
    assert f"grammar nesting depth 100000 exceeds the limit of {gl.GRAMMAR_MAX_NESTING}" in message


def test_huge_grammar_is_refused_by_size():
    message = refused(check_grammar, HUGE)
    assert f"exceeds the limit of {gl.GRAMMAR_MAX_BYTES}" in message and "grammar size" in message


def test_too_many_alternatives():
    grammar = "root ::= " + " | ".join(f'"{i}"' for i in range(gl.GRAMMAR_MAX_ALTERNATIVES + 2))
    assert len(grammar) < gl.GRAMMAR_MAX_BYTES
    message = refused(check_grammar, grammar)
    assert "grammar alternative count" in message
    assert str(gl.GRAMMAR_MAX_ALTERNATIVES) in message


def test_too_many_rules():
    grammar = "root ::= r0\n" + "".join(f"r{i} ::= r\n" for i in range(gl.GRAMMAR_MAX_RULES))
    assert len(grammar) < gl.GRAMMAR_MAX_BYTES
    assert "grammar rule count" in refused(check_grammar, grammar)


@pytest.mark.parametrize("rep", ["{100000}", "{0,100000}", "{100000,}", "{99999999999999999999}"])
def test_repetition_count_past_the_limit(rep):
    message = refused(check_grammar, f'root ::= "x"{rep}')
    assert "grammar repetition count" in message
    assert str(gl.GRAMMAR_MAX_REPETITION) in message


def test_repetition_of_a_long_literal_is_refused_by_expanded_size():
    grammar = 'root ::= "' + "a" * 5000 + '"{0,900}'
    assert "after expanding repetitions" in refused(check_grammar, grammar)


def test_brackets_in_strings_classes_and_comments_do_not_count():
    deep = "(" * 5000
    # Classes are bounded in size: several of them hold more brackets than the nesting limit.
    classes = " ".join(f"[{'(' * 100}]" for _ in range(gl.GRAMMAR_MAX_NESTING // 100 + 1))
    grammar = f'root ::= "{deep}" {classes} <{deep}> # {deep}\n'
    check_grammar(grammar)


def test_llama_cpp_grammars_pass():
    grammars = builtin_grammars()
    assert {"json", "c", "chess", "arithmetic", "japanese", "list"} <= set(grammars)
    for text in grammars.values():
        check_grammar(text)


def test_grammars_at_the_limits_pass():
    check_grammar("root ::= " + "(" * gl.GRAMMAR_MAX_NESTING + '"a"' + ")" * gl.GRAMMAR_MAX_NESTING)
    check_grammar(f'root ::= "x"{{0,{gl.GRAMMAR_MAX_REPETITION}}}')
    check_grammar("root ::= " + " | ".join(f'"{i}"' for i in range(gl.GRAMMAR_MAX_ALTERNATIVES)))


# --- JSON schema --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "shown"),
    [
        ({"type": "string", "maxLength": 20000}, "maxLength 20000"),
        ({"type": "string", "maxLength": 1e9}, "maxLength 1000000000"),
        ({"type": "string", "minLength": 10**6}, "minLength 1000000"),
        ({"type": "array", "items": {"type": "string"}, "minItems": 10**6}, "minItems 1000000"),
        ({"type": "array", "maxItems": 10**6}, "maxItems 1000000"),
        ({"type": "object", "minProperties": 10**6}, "minProperties 1000000"),
        ({"type": "object", "maxProperties": 10**6}, "maxProperties 1000000"),
    ],
)
def test_expanding_schema_bounds_are_refused_before_conversion(schema, shown):
    message = refused(json_schema_to_gbnf, schema)
    assert shown in message and f"exceeds the limit of {gl.SCHEMA_MAX_REPETITION}" in message


def test_nested_bound_names_its_property_path():
    schema = {"type": "object", "properties": {"bio": {"type": "string", "maxLength": 20000}}}
    assert "json_schema.properties.bio maxLength 20000" in refused(check_schema, schema)


def test_deep_schema_is_refused():
    schema: dict = {"type": "string"}
    for _ in range(gl.SCHEMA_MAX_DEPTH // 2 + 1):  # each object takes two levels
        schema = {"type": "object", "properties": {"a": schema}}
    assert "json_schema nesting depth" in refused(json_schema_to_gbnf, schema)
    for _ in range(100_000):
        schema = {"type": "array", "items": schema}
    assert "json_schema nesting depth" in refused(json_schema_to_gbnf, schema)


@pytest.mark.parametrize("levels", [60, 200])
def test_deep_schemas_llama_server_takes_convert(levels):
    """llama-server sets no depth of its own: objects nested 60 (or 200) deep become a
    grammar here too."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    grammar = json_schema_to_gbnf(schema)
    assert grammar.count("-kv ::=") >= levels  # a rule for each level's key
    check_grammar(grammar)


SHAPES = {
    "object": (2, lambda s: {"type": "object", "properties": {"a": s}}),
    "array": (1, lambda s: {"type": "array", "items": s}),
    "anyOf": (2, lambda s: {"anyOf": [s, {"type": "null"}]}),
    "allOf": (2, lambda s: {"allOf": [s]}),
    "additional": (1, lambda s: {"type": "object", "additionalProperties": s}),
    "tuple": (2, lambda s: {"type": "array", "prefixItems": [s]}),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_schemas_as_deep_as_allowed_convert_or_are_refused_in_one_line(shape):
    """At the depth limit, on a thread as a server converts them, every shape of schema
    becomes a grammar or a UsageError, never a RecursionError or a crash."""
    import threading

    levels, wrap = SHAPES[shape]
    schema: dict = {"type": "string"}
    for _ in range((gl.SCHEMA_MAX_DEPTH - 1) // levels):
        schema = wrap(schema)
    outcome: list[object] = []

    def convert() -> None:
        try:
            outcome.append(json_schema_to_gbnf(schema))
        except BaseException as exc:  # reported below, from the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=convert)
    thread.start()
    thread.join()
    assert isinstance(outcome[0], str | UsageError), repr(outcome[0])


def test_huge_enum_is_refused():
    message = refused(json_schema_to_gbnf, {"enum": list(range(gl.SCHEMA_MAX_ENUM + 1))})
    assert "enum values" in message and str(gl.SCHEMA_MAX_ENUM) in message


@pytest.mark.parametrize(
    "pattern", ["^a{0,100000}$", "^(a{1,900}){900}$", "^((ab{999}){999})$", "^" + "a" * 5000 + "$"]
)
def test_expanding_pattern_is_refused(pattern):
    assert "pattern" in refused(json_schema_to_gbnf, {"type": "string", "pattern": pattern})


def test_remote_ref_is_refused_without_fetching():
    message = refused(json_schema_to_gbnf, {"$ref": "https://example.invalid/schema.json"})
    assert "only references into the same schema" in message


def test_many_large_bounds_add_up_to_the_size_limit():
    # Each bound is under the limit; together the grammar would be several megabytes.
    props = {
        f"field_{i}": {"type": "array", "items": {"type": "string"}, "maxItems": 999}
        for i in range(200)
    }
    assert "estimated grammar size" in refused(
        json_schema_to_gbnf, {"type": "object", "properties": props}
    )


def test_ref_cycle_is_a_usage_error_not_a_crash():
    from localfab.errors import UsageError

    schema = {
        "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
        "$ref": "#/$defs/node",
    }
    try:
        grammar = json_schema_to_gbnf(schema)
    except UsageError:
        return
    check_grammar(grammar)


def test_typical_schemas_pass_and_their_grammar_passes():
    grammar = json_schema_to_gbnf(TYPICAL_SCHEMA)
    check_grammar(grammar)
    json_schema_to_gbnf({"type": "string", "maxLength": gl.SCHEMA_MAX_REPETITION})
    json_schema_to_gbnf({"type": "array", "items": {"type": "integer"}, "maxItems": 500})
    json_schema_to_gbnf({"enum": [f"value {i}" for i in range(1000)]})
    many = {f"field_{i}": {"type": "string", "maxLength": 50} for i in range(200)}
    check_grammar(json_schema_to_gbnf({"type": "object", "properties": many}))


# --- request parameters -------------------------------------------------------------------------

SETTINGS = ServerSettings()


def api_error(body: dict) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_generation(body, SETTINGS)
    assert info.value.code == 400 and info.value.type == "invalid_request_error"
    return info.value


def test_request_grammar_past_a_limit_is_a_400_naming_it():
    err = api_error({"grammar": NESTED})
    assert err.message.startswith("Field 'grammar': grammar nesting depth 100000 exceeds")
    assert "Field 'grammar': grammar size" in api_error({"grammar": HUGE}).message


def test_request_json_schema_past_a_limit_is_a_400_naming_it():
    err = api_error({"json_schema": {"type": "string", "maxLength": 20000}})
    assert "maxLength 20000 exceeds the limit of" in err.message
    err = api_error({"json_schema": {"type": "array", "minItems": 1e6}})
    assert "minItems 1000000 exceeds the limit of" in err.message


def test_repeat_last_n_minus_one_means_the_context_and_large_values_are_clamped():
    gen = parse_generation({"repeat_last_n": -1, "repeat_penalty": 1.1}, SETTINGS)
    assert gen.sampling.repeat_last_n == -1
    assert "repeat_last_n" in api_error({"repeat_last_n": -2}).message
    assert penalty_window(-1, 2048) == 2048
    assert penalty_window(2**31 - 1, 2048) == 2048
    assert penalty_window(64, 2048) == 64
    assert penalty_window(0, 2048) == 0


@pytest.mark.parametrize("grammar", ['root ::= ("a"?){0,1000}', "root ::= x{0,300}\nx ::= [a]?"])
def test_repeated_group_or_rule_is_bounded_more_tightly(grammar):
    # A part that may match nothing, repeated: llama.cpp spends minutes per token on it.
    message = refused(check_grammar, grammar)
    assert f"exceeds the limit of {gl.GRAMMAR_MAX_GROUP_REPETITION}" in message
    # A group that must match something may be repeated up to the limit.
    check_grammar(f'root ::= ("a" "b"?){{0,{gl.GRAMMAR_MAX_GROUP_REPETITION}}}')


# --- costly per token: runs of optional elements, long classes, hidden repetition counts --------

OPTIONAL_RUN = "root ::= " + '"a"? ' * 200  # seconds to minutes a token before it was refused
LONG_CLASS = "root ::= [^" + "a" * 100_000 + "]"  # seconds a token
HIDDEN_BOUND = 'root ::= (("a"?){#}\n0,150})'  # llama.cpp reads {0,150}: 11 s a token
OPTIONAL_PATTERN = {"type": "string", "pattern": "^" + "a?" * 200 + "$"}


@pytest.mark.parametrize(
    "grammar",
    [
        OPTIONAL_RUN,
        "root ::= " + '" "? ' * (gl.GRAMMAR_MAX_NULLABLE_RUN + 1),
        "root ::= " + "[ \\t\\n]* " * (gl.GRAMMAR_MAX_NULLABLE_RUN + 1),
        "root ::= " + '"a"+ ' * (gl.GRAMMAR_MAX_NULLABLE_RUN + 1),
        "root ::= " + '"a"{0,3} ' * (gl.GRAMMAR_MAX_NULLABLE_RUN + 1),
        "root ::= " + '("a" | ) ' * (gl.GRAMMAR_MAX_NULLABLE_RUN + 1),
        'root ::= " "?{24}',  # 24 copies of an optional space
        'root ::= (" "?){24}',
        'root ::= ((" "? " "?){3}){2}',  # nested repetitions multiply
        "root ::= " + "s " * (gl.GRAMMAR_MAX_NULLABLE_RUN + 1) + '\ns ::= " "?',  # via a rule
        's ::= " "?\nroot ::= ' + "s " * (gl.GRAMMAR_MAX_NULLABLE_RUN + 1),
        'root ::= s s\ns ::= [^"]? [^"]?',  # almost any character: counts 3 each
        'root ::= [^"]? [^"]?',
    ],
)
def test_runs_of_optional_elements_are_refused(grammar):
    message = refused(check_grammar, grammar)
    assert "grammar run of optional elements" in message
    assert f"exceeds the limit of {gl.GRAMMAR_MAX_NULLABLE_RUN}" in message


def test_runs_of_optional_elements_within_the_limit_pass():
    check_grammar("root ::= " + '" "? ' * gl.GRAMMAR_MAX_NULLABLE_RUN)
    check_grammar('root ::= [^"]? "x" [^"]?')  # a required element ends the run
    check_grammar('root ::= "a" ("b" ("c" ("d" ("e" ("f" "g"?)?)?)?)?)?')  # nested: one at a time
    check_grammar('root ::= "[" ws (item ("," ws item)*)? "]"\nitem ::= [a-z]+ ws\nws ::= [ ]?')


def test_optional_element_total_is_bounded():
    # Each run is short, but the repetitions multiply into many copies of optional elements.
    grammar = 'root ::= ((("a" "b"? "c"?){30} "d"){30} "e"){30}'
    message = refused(check_grammar, grammar)
    assert "grammar optional element count" in message
    assert f"exceeds the limit of {gl.GRAMMAR_MAX_NULLABLE}" in message


def test_optional_run_from_a_json_schema_pattern_is_refused():
    message = refused(json_schema_to_gbnf, OPTIONAL_PATTERN)
    assert "grammar run of optional elements" in message


def test_long_character_class_is_refused():
    message = refused(check_grammar, LONG_CLASS)
    assert "grammar character class size 100000 characters" in message
    assert f"exceeds the limit of {gl.GRAMMAR_MAX_CLASS}" in message
    # Many classes under the limit each, together past the total.
    per = gl.GRAMMAR_MAX_CLASS - 8
    count = gl.GRAMMAR_MAX_CLASS_TOTAL // per + 1
    classes = " ".join(f"[^{chr(0x4E00 + i) * per}]" for i in range(count))
    assert "grammar character classes' total size" in refused(check_grammar, f"root ::= {classes}")
    check_grammar(f"root ::= [^{'a' * gl.GRAMMAR_MAX_CLASS}] [\\x00-\\x1F\\u00e9-\\u00ff]")


@pytest.mark.parametrize(
    ("grammar", "shown"),
    [
        (HIDDEN_BOUND, "grammar repetition count of a group or rule 150"),
        ('root ::= "x"{ # a comment with a } in it\n 0, 100000 }', "grammar repetition count"),
        ('root ::= "x"{0,#}\n100000}', "grammar repetition count 100000"),
        ('root ::= "x"{0,1_000_000}', "is not of the form"),
        ('root ::= "x"{0,+5}', "is not of the form"),
    ],
)
def test_repetition_bounds_are_read_as_llama_cpp_reads_them(grammar, shown):
    assert shown in refused(check_grammar, grammar)


def test_a_comment_ended_by_a_carriage_return_hides_nothing():
    # llama.cpp ends a comment at \r as well as \n: what follows is grammar.
    grammar = 'root ::= "a" # note\rx ::= ' + '"a"? ' * 100
    assert "grammar run of optional elements" in refused(check_grammar, grammar)


def test_plain_repetition_bounds_with_spaces_pass():
    check_grammar('root ::= "x"{ 2 , 5 } "y"{3} "z"{1,}')


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        ({"grammar": OPTIONAL_RUN}, "grammar run of optional elements"),
        ({"grammar": LONG_CLASS}, "grammar character class size"),
        ({"grammar": HIDDEN_BOUND}, "grammar repetition count of a group or rule 150"),
        ({"json_schema": OPTIONAL_PATTERN}, "grammar run of optional elements"),
    ],
)
def test_costly_grammars_are_a_400_naming_the_limit(body, shown):
    assert shown in api_error(body).message
