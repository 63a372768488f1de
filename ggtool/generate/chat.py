"""Chat templates: a conversation rendered into a prompt by the model's `tokenizer.chat_template` (a
Jinja2 template), set up as transformers' apply_chat_template and llama-cpp-python's
Jinja2ChatFormatter set it up, so that the prompt is theirs byte for byte.

The environment: jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
loopcontrols extension (and `{% generation %}` passed through), `tojson` without ASCII escapes
(json.dumps with ensure_ascii=False, indent, separators, sort_keys), and the names `messages`,
`bos_token`, `eos_token` (the texts of the model's BOS and EOS tokens), `add_generation_prompt`,
`raise_exception(message)` and `strftime_now(format)`.

A template is code from the model file or the user, so it runs bounded: in the sandbox (no
attribute of Python's internals, no mutation of what it is given), for at most RENDER_SECONDS, with
no value or output over MAX_CHARS characters, no repetition (`'x' * n`, `'x'|center(n)`,
`'x'.ljust(n)`) past MAX_CHARS, and Python's recursion limit. Every failure is one
ChatTemplateError naming the template and, where Jinja knows it, the line.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from datetime import datetime

from ..errors import GGToolError

RENDER_SECONDS = 10.0
MAX_CHARS = 8 << 20          # 8 Mi characters: the most a value or the prompt may hold
MAX_TEMPLATE_BYTES = 1 << 20
ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = ("role", "content", "name")


class ChatTemplateError(GGToolError):
    """A chat template that cannot be used or fails; `source` names it (a file, or the model's
    tokenizer.chat_template), `line` is the template's line where Jinja knows it, `kind` one of
    no-template, syntax, raised, timeout, too-large, sandbox, failed, not-text."""

    def __init__(self, source: str, message: str, kind: str, line: int | None = None):
        self.source, self.kind, self.line, self.message = source, kind, line, message
        where = f"{source}, line {line}" if line else source
        super().__init__(f"{where}: {message}")


class MessagesError(GGToolError):
    """A conversation that is not a list of {role, content} messages; `where` names the message
    (its line in a JSON Lines file, or its index)."""

    kind = "messages"

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}")


def check_message(msg, where: str) -> dict:
    """One message, OpenAI-style: {"role": system|user|assistant|tool, "content": text or a list of
    parts ({"type": "text", "text": ...}), "name" optional}. Returns it as a plain dict."""
    if not isinstance(msg, dict):
        raise MessagesError(where, f"a message is a JSON object with \"role\" and \"content\", not {type(msg).__name__}")
    for key in msg:
        if key not in MESSAGE_KEYS:
            raise MessagesError(where, f"key {key!r} is not supported (a message has {', '.join(MESSAGE_KEYS)})")
    role = msg.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise MessagesError(where, f"role {json.dumps(role, ensure_ascii=False)} is not one of {', '.join(ROLES)}")
    if "content" not in msg:
        raise MessagesError(where, "the message has no \"content\"")
    content = msg["content"]
    if isinstance(content, list):
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise MessagesError(where, "a content list holds text parts only ({\"type\": \"text\", \"text\": ...})")
    elif not isinstance(content, str):
        raise MessagesError(where, f"content is text (or a list of text parts), not {type(content).__name__}")
    if "name" in msg and not isinstance(msg["name"], str):
        raise MessagesError(where, "name is text")
    return dict(msg)


def read_messages(text: str, source: str) -> list[dict]:
    """A conversation from JSON Lines: one message per non-blank line (ggtool.json_input reads each)."""
    from .. import json_input
    from ..errors import InputError

    out = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json_input.loads(line)
        except json.JSONDecodeError as e:
            raise MessagesError(f"{source} line {no}", f"not JSON ({e.msg}, column {e.colno})") from None
        except InputError as e:
            raise MessagesError(f"{source} line {no}", str(e)) from None
        out.append(check_message(value, f"{source} line {no}"))
    if not out:
        raise MessagesError(source, "no messages (one JSON object per line: {\"role\": \"user\", \"content\": ...})")
    return out


class _Bounds:
    """The deadline and size bounds of one render, checked on every line the template runs."""

    def __init__(self, source: str, seconds: float):
        self.source, self.deadline = source, time.monotonic() + seconds
        self.seconds = seconds

    def check_value(self, v) -> None:
        from jinja2.utils import Namespace

        if isinstance(v, Namespace):   # {% set ns.x = ... %}: the values live in the namespace
            for x in v._Namespace__attrs.values():
                self.check_value(x)
        elif isinstance(v, (str, list, tuple, dict)) and len(v) > MAX_CHARS:
            raise ChatTemplateError(self.source, f"a value grew past {MAX_CHARS} characters or items", "too-large")

    def tracer(self, frame, event, arg):
        if frame.f_code.co_filename != "<template>":
            return None
        return self._local

    def _local(self, frame, event, arg):
        if event == "line":
            if time.monotonic() > self.deadline:
                raise ChatTemplateError(self.source, f"still rendering after {self.seconds:g} s: a template "
                                        "that does not end", "timeout")
            for v in frame.f_locals.values():
                self.check_value(v)
        return self._local


def _bounded_call(f):
    """A filter or global wrapped so that no int argument asks for more than MAX_CHARS."""
    @functools.wraps(f)
    def call(*args, **kwargs):
        _check_ints(args, kwargs)
        return f(*args, **kwargs)
    return call


def _check_ints(args, kwargs) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_CHARS:
            raise _TooLarge(a)


class _TooLarge(Exception):
    def __init__(self, value):
        self.value = value


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """transformers' {% generation %} ... {% endgeneration %}: the body, as it is."""

        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_CHARS:
                        raise _TooLarge(n)
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(right) > 256:
                raise _TooLarge(right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's own signature
            _check_ints(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    env = Sandbox(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                  extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    for name, f in list(env.filters.items()):
        env.filters[name] = _bounded_call(f)
    return env


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _Raised(Exception):
    pass


def _raise_exception(message):
    raise _Raised(str(message))


def _strftime_now(fmt):
    return datetime.now().strftime(str(fmt))


class ChatTemplate:
    """A chat template (`text`), named `source` in errors; `render(messages)` the prompt."""

    def __init__(self, text: str, source: str, bos_token: str = "", eos_token: str = ""):
        self.text, self.source, self.bos_token, self.eos_token = text, source, bos_token, eos_token
        if len(text.encode("utf-8", "surrogatepass")) > MAX_TEMPLATE_BYTES:
            raise ChatTemplateError(source, f"a chat template is at most {MAX_TEMPLATE_BYTES} bytes", "too-large")
        import jinja2

        try:
            self._template = _environment().from_string(text)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(source, f"not a Jinja template: {e.message}", "syntax", e.lineno) from None
        except RecursionError:
            raise ChatTemplateError(source, "not a Jinja template: nested too deep", "syntax") from None

    def render(self, messages: list[dict], add_generation_prompt: bool = True, seconds: float = RENDER_SECONDS,
               **extra) -> str:
        """The prompt for `messages` (each checked as check_message checks it), rendered in at most
        `seconds`."""
        messages = [check_message(m, f"message {i + 1}") for i, m in enumerate(messages)]
        bounds = _Bounds(self.source, seconds)
        names = dict(messages=messages, bos_token=self.bos_token, eos_token=self.eos_token,
                     add_generation_prompt=add_generation_prompt, raise_exception=_raise_exception,
                     strftime_now=_strftime_now, **extra)
        old = sys.gettrace()
        sys.settrace(bounds.tracer)
        try:
            parts, size = [], 0
            for chunk in self._template.generate(**names):
                size += len(chunk)
                if size > MAX_CHARS:
                    raise ChatTemplateError(self.source, f"the prompt grew past {MAX_CHARS} characters", "too-large")
                parts.append(chunk)
        except ChatTemplateError:
            raise
        except _Raised as e:
            raise ChatTemplateError(self.source, f"the template refused the conversation: {e}", "raised",
                                    _template_line(e)) from None
        except _TooLarge as e:
            raise ChatTemplateError(self.source, f"asks for {e.value} repetitions or characters (at most {MAX_CHARS})",
                                    "too-large", _template_line(e)) from None
        except RecursionError:
            raise ChatTemplateError(self.source, "recursion too deep", "failed") from None
        except MemoryError:
            raise ChatTemplateError(self.source, "ran out of memory", "too-large") from None
        except Exception as e:   # the sandbox's SecurityError, a template's TypeError, ...
            from jinja2.exceptions import SecurityError, TemplateError

            kind = "sandbox" if isinstance(e, SecurityError) else "failed"
            what = e.message if isinstance(e, TemplateError) and e.message else f"{type(e).__name__}: {e}"
            raise ChatTemplateError(self.source, f"failed: {what}", kind, _template_line(e)) from None
        finally:
            sys.settrace(old)
        return "".join(parts)


def _template_line(e: BaseException) -> int | None:
    """The template's line where `e` was raised (Jinja's rewritten traceback has frames of
    "<template>" at template lines)."""
    line, tb = None, e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def model_template(metadata, source: str) -> str | None:
    """The model's tokenizer.chat_template (None if it has none); `metadata(key)` reads one key."""
    text = metadata("tokenizer.chat_template")
    if text is None:
        return None
    if not isinstance(text, str):
        raise ChatTemplateError(source, "tokenizer.chat_template is not text", "not-text")
    return text
