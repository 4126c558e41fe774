"""Chat templates: the model's own (from GGUF metadata) rendered in a sandbox, or a built-in one.

GGUF chat templates are Jinja programs written by whoever made the file, so they are untrusted
input: they run in Jinja's immutable sandbox, with only the helpers Hugging Face templates expect.
A model without a template (base models such as the test model) gets a built-in template chosen
by its architecture, and the caller is told so.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import CodeType
from typing import Any

from jinja2 import TemplateError, Undefined, nodes
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from localfab.chat.call_args import PROBE_CALL, arguments_as_text
from localfab.errors import UsageError

ROLES = ("system", "user", "assistant", "tool")

_GEMMA = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<start_of_turn>model\n' }}
{%- endif -%}"""

_CHATML = """{%- for message in messages -%}
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|im_start|>assistant\n' }}
{%- endif -%}"""

_LLAMA3 = """{{ bos_token }}
{%- for message in messages -%}
{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif -%}"""

_PHI3 = """{%- for message in messages -%}
{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|assistant|>\n' }}
{%- endif -%}"""

BUILTIN_TEMPLATES: dict[str, str] = {
    "gemma": _GEMMA,
    "chatml": _CHATML,
    "llama3": _LLAMA3,
    "phi3": _PHI3,
}

# Architecture (general.architecture) -> built-in template for models that carry none.
_BY_ARCH = {
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3n": "gemma",
    "llama": "llama3",
    "phi3": "phi3",
}

_CONTINUE_MARK = "\x00localfab-continue\x00"


# What one rendering may spend. A chat template is a program from the model file; these bound
# its steps (calls, attribute reads, operators, loop iterations), the size of any value it builds
# and of its output, how deeply its calls nest, and its time, so that a hostile or broken one
# fails with a clear error instead of holding a thread or filling memory.
RENDER_SECONDS = 10.0
STEPS_BASE = 1_000_000
STEPS_PER_MESSAGE = 1_000
CHARS_BASE = 1 << 20
CHARS_PER_INPUT_CHAR = 8  # output and values may be this many times the input's size
MAX_CALL_DEPTH = 64
MAX_INT_BITS = 1 << 16

# Filters and methods whose result grows with the value's size times an argument.
_MULTIPLYING = frozenset({"indent", "wordwrap", "expandtabs", "tojson"})
_DIGITS = re.compile(r"\d+")


class BudgetExceeded(TemplateError):
    """A rendering went past one of its bounds."""


def _raise(message: str) -> None:
    raise TemplateError(message)


_SIZED = (str, list, tuple, dict, set)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, _SIZED) else 0


def _budgeted(hook: str, node: nodes.Expr) -> nodes.Call:
    """`node` passed through one of the environment's budget hooks."""
    hook_node = nodes.EnvironmentAttribute(hook, lineno=node.lineno)
    return nodes.Call(hook_node, [node], [], None, None, lineno=node.lineno)


def _instrument(node: nodes.Node) -> None:
    """Charge every loop's iterations to the budget and check every concatenation's size."""
    for name, value in node.iter_fields():
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if not isinstance(item, nodes.Node):
                continue
            _instrument(item)
            if isinstance(item, nodes.Concat):
                checked = _budgeted("lf_value", item)
                if isinstance(value, list):
                    value[i] = checked
                else:
                    setattr(node, name, checked)
    if isinstance(node, nodes.For):
        node.iter = _budgeted("lf_iter", node.iter)  # type: ignore[arg-type]


def _tojson(
    value: Any,
    indent: int | None = None,
    *,
    ensure_ascii: bool = False,
    sort_keys: bool = False,
    separators: Sequence[str] | None = None,
) -> str:
    """Hugging Face's tojson: JSON with its keyword arguments (templates pass them)."""
    seps = (
        (separators[0], separators[1]) if separators is not None and len(separators) == 2 else None
    )
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys, separators=seps
    )


def _blank(value: Any) -> Any:
    return "" if value is None or isinstance(value, Undefined) else value


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with a budget for one rendering."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, *, max_steps: int, max_chars: int, seconds: float) -> None:
        # `{% break %}` and `{% continue %}`: llama.cpp's template engine takes them, and real
        # templates use them (Command R7B's).
        super().__init__(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        self.max_steps = max_steps
        self.max_chars = max_chars
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.steps = 0
        self.next_clock_check = 0
        self.depth = 0
        self.concat = self.lf_concat  # type: ignore[method-assign]
        self.globals.pop("lipsum", None)  # its size arguments are not bounded
        self.globals["range"] = self.lf_range
        self.globals["raise_exception"] = _raise
        self.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.filters["tojson"] = _tojson
        self.filters = {name: self._guard(name, f) for name, f in self.filters.items()}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        _instrument(tree)
        tree.set_environment(self)
        return tree

    # --- the budget ------------------------------------------------------------------------

    def lf_tick(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.max_steps:
            raise BudgetExceeded(f"it ran more than {self.max_steps} steps")
        if self.steps >= self.next_clock_check:  # the clock is read every few dozen steps
            self.next_clock_check = self.steps + 32
            if time.monotonic() > self.deadline:
                raise BudgetExceeded(f"it ran longer than {self.seconds:g} s")

    def lf_value(self, value: Any) -> Any:
        if isinstance(value, _SIZED) and len(value) > self.max_chars:
            raise BudgetExceeded(
                f"it built a value of {_size(value)} characters or items "
                f"(at most {self.max_chars} here)"
            )
        return value

    def lf_iter(self, iterable: Any) -> Any:
        try:
            n = len(iterable)
        except TypeError:
            return self._counting(iterable)
        self.lf_tick(n + 1)
        return iterable

    def _counting(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for item in iterable:
            self.lf_tick()
            yield item

    def lf_concat(self, parts: Iterable[str]) -> str:
        out: list[str] = []
        total = 0
        for part in parts:
            total += len(part)
            if total > self.max_chars:
                raise BudgetExceeded(f"its output passed {self.max_chars} characters")
            out.append(part)
        return "".join(out)

    def lf_range(self, *args: int) -> range:
        self._check_ints(args)
        rng = safe_range(*args)
        self.lf_tick(len(rng))
        return rng

    def _check_ints(self, args: Iterable[Any]) -> None:
        for arg in args:
            if isinstance(arg, int) and abs(arg) > self.max_chars:
                raise BudgetExceeded(f"it used the number {arg}, too large for a chat template")

    def _check_format(self, fmt: Any) -> None:
        if isinstance(fmt, str):
            for digits in _DIGITS.findall(fmt):
                if len(digits) > 9 or int(digits) > self.max_chars:
                    raise BudgetExceeded(f"it formats with a width of {digits}")

    def _check_growth(
        self, name: str, value: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        """Refuse a call whose result would be too large, before it is built."""
        extra = [*args, *kwargs.values()]
        self._check_ints(extra)
        width = max((abs(a) for a in extra if isinstance(a, int)), default=0)
        text = sum(len(a) for a in extra if isinstance(a, str))
        size = _size(value)
        if name in ("format", "format_map"):
            self._check_format(value)
        if name == "replace" and isinstance(value, str) and len(extra) >= 2:
            old, new = str(extra[0]), str(extra[1])
            hits = len(value) + 1 if not old else value.count(old)
            estimate = size + hits * len(new)
        elif name == "join":
            if isinstance(value, str):  # str.join(seq): the value is the separator
                sep, seq = value, (args[0] if args else ())
            else:  # the join filter: seq|join(sep)
                seq, sep = value, (args[0] if args else kwargs.get("d", ""))
            count = len(seq) if isinstance(seq, Sequence) else 0
            estimate = sum(_size(x) for x in seq) if isinstance(seq, Sequence) else 0
            estimate += count * len(str(sep))
        elif name in _MULTIPLYING:
            estimate = size * (1 + width + text)
        else:
            estimate = size + width + text
        if estimate > self.max_chars:
            raise BudgetExceeded(
                f"{name}() would build about {estimate} characters (at most {self.max_chars} here)"
            )

    def _guard(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        passes = getattr(func, "jinja_pass_arg", None) is not None

        def guarded(*args: Any, **kwargs: Any) -> Any:
            self.lf_tick()
            rest = args[1:] if passes else args
            if rest:
                value = rest[0]
                if name == "join" and not isinstance(value, Sequence | str | Mapping):
                    value = list(self._counting(value))
                    rest = (value, *rest[1:])
                    args = (args[0], *rest) if passes else rest
                self._check_growth(name, value, rest[1:], kwargs)
            return self.lf_value(func(*args, **kwargs))

        if passes:
            guarded.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
        return guarded

    # --- the sandbox's hooks ---------------------------------------------------------------

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.lf_tick()
        return self.lf_value(super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.lf_tick()
        return self.lf_value(super().getitem(obj, argument))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        self.lf_tick()
        if operator == "+":  # the common case, kept short: both sides were checked already
            if isinstance(left, str) != isinstance(right, str):
                # llama.cpp's engine: text + an undefined or none value is the text.
                left, right = (_blank(left), _blank(right))
            return self.lf_value(left + right)
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and _size(seq) * n > self.max_chars:
                    raise BudgetExceeded(f"it repeats a value {n} times")
        elif operator == "**":
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and abs(left) > 1
                and right * left.bit_length() > MAX_INT_BITS
            ):
                raise BudgetExceeded(f"it raises a number to the power {right}")
        elif operator == "%" and isinstance(left, str):
            self._check_format(left)
            self._check_ints(right if isinstance(right, tuple) else (right,))
        return self.lf_value(super().call_binop(context, operator, left, right))

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.lf_tick()
        target = getattr(obj, "__wrapped__", obj)
        owner = getattr(target, "__self__", None)
        if isinstance(owner, str | list | tuple | dict):
            self._check_growth(getattr(target, "__name__", ""), owner, args, kwargs)
        else:
            self._check_ints([*args, *kwargs.values()])
        if self.depth >= MAX_CALL_DEPTH:
            raise BudgetExceeded(f"its calls nest deeper than {MAX_CALL_DEPTH}")
        self.depth += 1
        try:
            return self.lf_value(super().call(context, obj, *args, **kwargs))
        finally:
            self.depth -= 1


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> CodeType:
    env = _Sandbox(max_steps=STEPS_BASE, max_chars=CHARS_BASE, seconds=RENDER_SECONDS)
    return env.compile(source)


def _failure(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it nests too deeply"
    if isinstance(exc, MemoryError):
        return "it ran out of memory"
    if isinstance(exc, TemplateError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and where it came from."""

    source: str
    name: str  # "gguf", "file" (a template file the user gave) or a built-in name
    bos_token: str = ""
    eos_token: str = ""

    @property
    def builtin(self) -> bool:
        return self.name not in ("gguf", "file")

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The conversation as the model's prompt text.

        `variables` are the template's own (llama-server's `chat_template_kwargs`);
        `enable_thinking` is true unless they say otherwise, as in llama.cpp, so that a thinking
        model's template does not close its block before the reply.

        With `continue_final`, the last message is an assistant reply to be continued: the text
        ends exactly where that reply's text ends (no end-of-turn marker), so generation picks up
        mid-reply instead of starting a new turn.
        """
        msgs = [dict(m) for m in messages]
        if continue_final:
            if not msgs or msgs[-1].get("role") != "assistant":
                raise UsageError("only an assistant message at the end can be continued")
            final = msgs[-1].get("content") or ""
            msgs[-1]["content"] = _CONTINUE_MARK
            text = self._render(msgs, add_generation_prompt=False, variables=variables)
            cut = text.rfind(_CONTINUE_MARK)
            if cut < 0:
                raise UsageError("the chat template dropped the reply to continue")
            return text[:cut] + final
        return self._render(msgs, add_generation_prompt=add_generation_prompt, variables=variables)

    def _render(
        self,
        msgs: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        # A template that writes a call's arguments as text (Functionary v3.2's
        # `'\n' + arguments`) gets them as JSON text, as llama.cpp gives them.
        texts = arguments_as_text(msgs)
        if texts is not None and self.takes_text_arguments:
            msgs = texts
        return self._render_once(msgs, add_generation_prompt, variables)

    @functools.cached_property
    def takes_text_arguments(self) -> bool:
        """Whether the template fails on a call's arguments as an object and renders them as
        text (asked once, as llama.cpp reads a template's capabilities)."""
        try:
            self._render_once(PROBE_CALL, False)
            return False
        except UsageError:
            pass
        try:
            self._render_once(arguments_as_text(PROBE_CALL) or PROBE_CALL, False)
        except UsageError:
            return False
        return True

    def _render_once(
        self,
        msgs: list[dict[str, Any]],
        add_generation_prompt: bool,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        size = len(self.source) + sum(len(str(m.get("content") or "")) for m in msgs)
        env = _Sandbox(
            max_steps=STEPS_BASE + STEPS_PER_MESSAGE * len(msgs),
            max_chars=CHARS_BASE + CHARS_PER_INPUT_CHAR * size,
            seconds=RENDER_SECONDS,
        )
        today = datetime.now()
        try:
            code = _compiled(self.source)
            template = env.template_class.from_code(env, code, env.make_globals(None))
            context = template.new_context(
                {
                    "enable_thinking": True,
                    # Today, as llama-server gives it to every template (Llama 3.x, FireFunction).
                    "date_string": today.strftime("%d %b %Y"),
                    "datetime": today.strftime("%b %d %Y"),
                    **(variables or {}),
                    "messages": msgs,
                    "add_generation_prompt": add_generation_prompt,
                    "bos_token": self.bos_token,
                    "eos_token": self.eos_token,
                }
            )
            return env.lf_concat(template.root_render_func(context))
        except Exception as exc:  # the template is untrusted code: any failure is its own
            raise UsageError(
                f"the chat template ({self.name}) failed: {_failure(exc)}; "
                "check the messages, or send raw text without a template"
            ) from None


def resolve_template(
    gguf_template: str | None,
    architecture: str,
    *,
    bos_token: str = "",
    eos_token: str = "",
) -> tuple[ChatTemplate, str | None]:
    """The template to use and a notice when it is not the model's own."""
    if gguf_template and gguf_template.strip():
        return ChatTemplate(gguf_template, "gguf", bos_token, eos_token), None
    name = _BY_ARCH.get(architecture, "chatml")
    notice = (
        f"the model has no chat template; using the built-in {name!r} template "
        f"for architecture {architecture or 'unknown'!r}"
    )
    return ChatTemplate(BUILTIN_TEMPLATES[name], name, bos_token, eos_token), notice
