"""Chat templates: sandboxed GGUF templates, built-ins by architecture, continuation rendering."""

from __future__ import annotations

import pytest

from localfab.chat.messages import validate_messages
from localfab.chat.templates import ChatTemplate, resolve_template
from localfab.errors import UsageError

CHATML_GGUF = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How"},
]


def test_gguf_template_is_used_when_present():
    template, notice = resolve_template(CHATML_GGUF, "qwen2")
    assert notice is None and template.name == "gguf"
    text = template.render(MSGS[:2])
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_builtin_template_by_architecture_with_a_notice():
    template, notice = resolve_template(None, "gemma3", bos_token="<bos>")
    assert template.name == "gemma" and notice and "gemma3" in notice
    text = template.render(MSGS[:2])
    # Gemma has no system role: the system prompt opens the first user turn.
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert resolve_template("", "unknown-arch")[0].name == "chatml"


def test_today_and_undefined_text_as_llama_cpp_gives_them():
    from datetime import date

    # llama-server passes today's date to every template (Llama 3.x's date_string,
    # FireFunction's datetime), and its engine reads text + an undefined value as the text.
    source = "{{ date_string }}|{{ datetime }}|{{ 'x' + missing }}|{{ none_value + 'y' }}"
    template = ChatTemplate(source, "test", "", "")
    today = date.today()
    text = template.render(MSGS[:1], variables={"none_value": None})
    assert text == f"{today:%d %b %Y}|{today:%b %d %Y}|x|y"
    with pytest.raises(UsageError):  # anything else with an undefined value stays an error
        ChatTemplate("{{ 1 + missing }}", "test", "", "").render(MSGS[:1])


def test_continue_final_ends_exactly_at_the_reply_text():
    for source, arch in ((CHATML_GGUF, "qwen2"), (None, "gemma3"), (None, "llama")):
        template, _ = resolve_template(source, arch)
        text = template.render(MSGS, continue_final=True)
        assert text.endswith("Hello! How")
        assert "<|im_end|>" not in text[-12:] and "<end_of_turn>" not in text[-20:]


def test_sandbox_blocks_python_internals():
    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}", "gguf")
    with pytest.raises(UsageError, match="chat template"):
        evil.render(MSGS[:2])
    mutate = ChatTemplate("{{ messages.append(1) }}", "gguf")
    with pytest.raises(UsageError):
        mutate.render(MSGS[:2])


def test_raise_exception_in_a_template_is_a_clear_error():
    strict = ChatTemplate("{{ raise_exception('roles must alternate') }}", "gguf")
    with pytest.raises(UsageError, match="roles must alternate"):
        strict.render(MSGS[:2])


@pytest.mark.parametrize(
    "bad, needle",
    [
        ([], "non-empty"),
        ("hi", "non-empty"),
        ([{"role": "wizard", "content": "x"}], "role"),
        ([{"role": "user", "content": 5}], "string"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "text parts"),
    ],
)
def test_validate_messages_rejects_bad_input(bad, needle):
    with pytest.raises(UsageError, match=needle):
        validate_messages(bad)


def test_validate_messages_joins_text_parts():
    out = validate_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert out == [{"role": "user", "content": "a\nb"}]  # a line apart, as llama-server


class _CharTokenizer:
    """A tokenizer with one token per character (its code point) and <t>, </t> as specials."""

    add_bos = True
    bos_token = 0
    eos_token = 1
    architecture = "test"
    SPECIAL = {"<t>": 1000, "</t>": 1001}

    def tokenize(self, text, *, add_special=True, parse_special=True):
        import re

        parts = re.findall(r"</?t>|.", text, re.S)
        return [self.SPECIAL[p] if p in self.SPECIAL else ord(p) for p in parts]

    def token_bytes(self, token, *, special=False):
        names = {v: k for k, v in self.SPECIAL.items()}
        return names.get(token, chr(token) if token < 0x110000 else "").encode()

    def token_text(self, token):
        return ""

    def chat_template(self):
        return None


def test_pinned_tokens_stand_in_for_content_the_template_places_verbatim():
    from localfab.chat.prompt import PromptBuilder

    tok = _CharTokenizer()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "you"}]
    verbatim = ChatTemplate("{% for m in messages %}<t>{{ m.content }}</t>\n{% endfor %}", "gguf")
    builder = PromptBuilder(tok, verbatim)  # type: ignore[arg-type]
    t, end, nl = 1000, 1001, ord("\n")
    assert builder.tokens(messages) == [0, t, *b"hi", end, nl, t, *b"you", end, nl]
    assert builder.tokens(messages, pinned={1: [7, 8]}) == [0, t, *b"hi", end, nl, t, 7, 8, end, nl]

    # A template that trims the content: whitespace-only tokens at the ends of the pinned ones
    # are left out; whitespace inside a token cannot be, so then the whole text is tokenized.
    trimming = ChatTemplate(
        "{% for m in messages %}<t>{{ m.content | trim }}</t>\n{% endfor %}", "gguf"
    )
    builder = PromptBuilder(tok, trimming)  # type: ignore[arg-type]
    tok.SPECIAL = {**tok.SPECIAL, " y": 900, "ou": 901}  # tokens only the model produces
    spaced = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " you\n\n"}]
    split = [ord(" "), ord("y"), 901, ord("\n"), ord("\n")]
    assert builder.tokens(spaced, pinned={1: split}) == [
        *builder.tokens(spaced)[:7],
        ord("y"),
        901,
        end,
        nl,
    ]
    glued = [900, 901, ord("\n"), ord("\n")]  # " y" is one token: its space cannot go
    assert builder.tokens(spaced, pinned={1: glued}) == builder.tokens(spaced)
    # So is a template that shows the content twice.
    twice = ChatTemplate("{% for m in messages %}{{ m.content * 2 }}{% endfor %}", "gguf")
    builder = PromptBuilder(tok, twice)  # type: ignore[arg-type]
    assert builder.tokens(messages, pinned={1: [7, 8]}) == builder.tokens(messages)


def test_pins_are_not_used_where_the_tokenizer_adds_text_to_a_fragment():
    """SentencePiece vocabularies with a space prefix put "▁" before a fragment's first word;
    a prompt spliced from separately tokenized fragments would then hold a space the template
    never rendered, so the whole text is tokenized instead."""
    from localfab.chat.prompt import PromptBuilder

    class SpacePrefix(_CharTokenizer):
        def tokenize(self, text, *, add_special=True, parse_special=True):
            tokens = super().tokenize(text)
            return tokens if text.startswith("<") else [ord(" "), *tokens]

    source = "{% for m in messages %}<t>{{ m.content }}\\nnext\\n{% endfor %}"
    template = ChatTemplate(source, "gguf")
    builder = PromptBuilder(SpacePrefix(), template)  # type: ignore[arg-type]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "you"}]
    assert builder.tokens(messages, pinned={1: [*b"you"]}) == builder.tokens(messages)
    assert builder.spelled(builder.tokens(messages, pinned={1: [*b"you"]})[1:]) == (
        builder.text(messages).encode()
    )


def _render_bounded(source: str, messages=MSGS[:2]) -> tuple[BaseException | None, int]:
    """Render in a thread, waiting at most a minute; (what it raised, peak bytes allocated)."""
    import threading
    import tracemalloc

    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            ChatTemplate(source, "gguf").render(messages)
            outcome.append(None)
        except BaseException as exc:  # what escapes is the point of the test
            outcome.append(exc)

    tracemalloc.start()
    try:
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert outcome, "the rendering did not stop"
    return outcome[0], peak


DOUBLINGS = "".join("{% set s = s ~ s %}" for _ in range(40))


@pytest.mark.parametrize(
    "source, needle",
    [
        # 10^15 iterations of nested loops, with and without output.
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
            "{% endfor %}{% endfor %}{% endfor %}",
            "steps",
        ),
        ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", ""),
        # A string doubled 40 times (a terabyte), by concatenation, in a loop and in blocks.
        ("{% set s = 'ab' %}" + DOUBLINGS + "{{ s }}", "value of"),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            "value of",
        ),
        ("{% set s = 'ab' %}" + DOUBLINGS.replace(" ~ ", " + ") + "{{ s }}", "value of"),
        (
            "{% set s = 'ab' %}"
            + "".join("{% set s %}{{ s }}{{ s }}{% endset %}" for _ in range(40))
            + "{{ s }}",
            "output",
        ),
        # Repetition, padding and powers that would take gigabytes or hours at once.
        ("{{ 'x' * 10 ** 9 }}", "repeats"),
        ("{{ ([0] * 10 ** 9) | length }}", "repeats"),
        ("{{ '%0999999999d' % 1 }}", "width"),
        ("{{ '{:>999999999}'.format('x') }}", "width"),
        ("{{ 'x' | center(999999999) }}", "too large"),
        ("{% set s = 'x' * 100000 %}{{ s | replace('', s) }}", "replace"),
        ("{% set s = 'x' * 100000 %}{{ s.join(s) }}", "join"),
        ("{{ 10 ** (10 ** 8) }}", "power"),
        # Recursion through macros and recursive loops.
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nest"),
        ("{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}", "nest"),
        # Errors of the template's own making, not sandbox errors.
        ("{{ messages[0]['content'] + 1 }}", "TypeError"),
        ("{{ range(10 ** 6) }}", "OverflowError"),
        ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ],
)
@pytest.mark.slow  # renders to the sandbox's limits: seconds of CPU
def test_hostile_templates_fail_clearly_with_bounded_memory(source: str, needle: str):
    error, peak = _render_bounded(source)
    assert isinstance(error, UsageError), repr(error)
    assert "chat template (gguf) failed" in str(error) and needle in str(error)
    assert peak < 64 * 1024 * 1024


@pytest.mark.slow  # renders to the sandbox's limits: seconds of CPU
def test_nested_loops_over_a_long_conversation_are_bounded():
    """Loops over the messages themselves: the budget grows with the conversation, but a
    template that is quadratic (or worse) in it still stops."""
    messages = [{"role": "user", "content": "hi"}] * 2000
    source = (
        "{% for a in messages %}{% for b in messages %}{% for c in messages %}"
        "{% endfor %}{% endfor %}{% endfor %}"
    )
    error, _ = _render_bounded(source, messages)
    assert isinstance(error, UsageError) and "steps" in str(error)


def test_rendering_has_a_time_limit(monkeypatch: pytest.MonkeyPatch):
    import localfab.chat.templates

    monkeypatch.setattr(localfab.chat.templates, "RENDER_SECONDS", 0.0)
    slow = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", "gguf")
    with pytest.raises(UsageError, match="longer than 0 s"):
        slow.render(MSGS[:2])


def test_ordinary_templates_render_long_conversations_within_the_budget():
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
        for i in range(20000)
    ]
    for source, arch in ((CHATML_GGUF, "qwen2"), (None, "gemma3"), (None, "llama"), (None, "x")):
        template, _ = resolve_template(source, arch)
        text = template.render(messages)
        assert text.count("message 19999") == 1
    # Filters and methods that templates use still work.
    tools = ChatTemplate(
        "{{ messages | map(attribute='content') | join(', ') | upper }}"
        "{{ messages | tojson(indent=2) | length > 0 }}{{ 'a-b'.split('-') | join }}"
        "{{ '%s!' % messages[0].content }}{{ '{}?'.format(messages[1].content) }}",
        "gguf",
    )
    assert tools.render(MSGS[:2]) == "BE BRIEF., HITrueabBe brief.!Hi?"
