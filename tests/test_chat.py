"""Chat templates (ggtool.generate.chat, `generate --chat`): the prompts of SmolLM2's, Qwen2.5-Coder's and
gemma-3-it's templates byte for byte as llama-cpp-python's Jinja2ChatFormatter and transformers render
them (tests/golden/chat/, its README), conversations checked, and templates as the hostile code they
may be: bounded in time and size, sandboxed, every failure one line."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, STORIES, fails, ok

from ggtool.generate import ChatTemplate, ChatTemplateError, MessagesError, check_message, read_messages

GOLDEN = ROOT / "tests" / "golden" / "chat"
RENDERED = json.loads((GOLDEN / "rendered.json").read_text(encoding="utf-8"))
CONVERSATIONS = json.loads((GOLDEN / "conversations.json").read_text(encoding="utf-8"))


def template(name: str) -> ChatTemplate:
    bos, eos = RENDERED["bos_eos"][name]
    return ChatTemplate((GOLDEN / f"{name}.jinja").read_text(encoding="utf-8"), name, bos, eos)


@pytest.mark.parametrize("name", sorted(RENDERED["rendered"]))
@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_rendered_as_llama_cpp_python_and_transformers(name, case):
    assert template(name).render(CONVERSATIONS[case]) == RENDERED["rendered"][name][case]


def test_the_golden_cases_cover_system_and_turns():
    """With and without a system message, and three conversations of several turns."""
    cases = CONVERSATIONS.values()
    assert any(c[0]["role"] == "system" for c in cases) and any(c[0]["role"] != "system" for c in cases)
    assert sum(1 for c in cases if sum(m["role"] == "assistant" for m in c) >= 1) >= 3
    assert RENDERED["transformers"]   # transformers rendered each the same (make.py asserts it)


def test_tojson_keeps_non_ascii_and_takes_json_dumps_arguments():
    t = ChatTemplate("{{ messages[0]|tojson }}|{{ {'b': 1, 'a': 'é'}|tojson(indent=1, sort_keys=True) }}", "t")
    assert t.render([{"role": "user", "content": "héllo"}]) == \
        '{"role": "user", "content": "héllo"}|{\n "a": "é",\n "b": 1\n}'


def test_the_environment_of_transformers():
    t = ChatTemplate("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                     "{{ bos_token }}{{ m.content }}{{ eos_token }}{% endfor %}\n"
                     "{% generation %}G{% endgeneration %}{{ add_generation_prompt }}"
                     "{{ strftime_now('%Y')|length }}", "t", "<s>", "</s>")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert t.render(msgs) == "<s>a</s>GTrue4"          # trim_blocks ate the newline after endfor
    assert t.render(msgs, add_generation_prompt=False).endswith("GFalse4")


# -- conversations -------------------------------------------------------------------------------------
def test_messages_from_json_lines():
    text = '{"role": "system", "content": "s"}\n\n{"role": "user", "content": [{"type": "text", "text": "u"}]}\n'
    assert read_messages(text, "m.jsonl") == [{"role": "system", "content": "s"},
                                              {"role": "user", "content": [{"type": "text", "text": "u"}]}]


@pytest.mark.parametrize("line, fragment", [
    ('{"role": "robot", "content": "x"}', 'm.jsonl line 2: role "robot" is not one of system, user, assistant, tool'),
    ('{"role": "user"}', 'm.jsonl line 2: the message has no "content"'),
    ('{"role": "user", "content": 5}', "content is text (or a list of text parts), not int"),
    ('{"role": "user", "content": "x", "tool_calls": []}', "key 'tool_calls' is not supported"),
    ('["user", "x"]', "a message is a JSON object"),
    ('{"role": "user", "content": [{"type": "image"}]}', "a content list holds text parts only"),
    ('{"role": "user", "content": "x"', "m.jsonl line 2: not JSON"),
    ("[" * 100000, "m.jsonl line 2: JSON is nested more than 64 levels deep"),
])
def test_bad_messages_are_one_line_naming_the_line(line, fragment):
    with pytest.raises(MessagesError) as e:
        read_messages('{"role": "user", "content": "ok"}\n' + line, "m.jsonl")
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_no_messages():
    with pytest.raises(MessagesError, match="no messages"):
        read_messages("\n\n", "m.jsonl")
    with pytest.raises(MessagesError, match="role"):
        check_message({"role": None, "content": ""}, "message 1")


# -- hostile templates ---------------------------------------------------------------------------------
USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("source, kind, fragment", [
    ("{{ raise_exception('roles must alternate') }}", "raised", "line 1: the template refused the conversation: roles"),
    ("{% for %}", "syntax", "not a Jinja template"),
    ("{{ 'x' * 100000000 }}", "too-large", "asks for 100000000"),
    ("{{ 'x'|center(1000000000) }}", "too-large", "asks for 1000000000"),
    ("{{ 'x'.ljust(1000000000) }}", "too-large", "asks for 1000000000"),
    ("{{ 10 ** 100000000 }}", "too-large", "asks for 100000000"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "too-large",
     "a value grew past"),
    ("{% for i in range(100000) %}{{ range(100000)|join }}{% endfor %}", "too-large", "grew past"),
    ("{{ messages.append(1) }}", "sandbox", "unsafe"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "sandbox", "unsafe"),
    ("{{ 1 / 0 }}", "failed", "ZeroDivisionError"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "failed", "recursion too deep"),
])
def test_a_hostile_template_is_one_clear_error(source, kind, fragment):
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplate(source, "evil.jinja").render(USER)
    assert e.value.kind == kind and fragment in str(e.value) and str(e.value).startswith("evil.jinja")
    assert "\n" not in str(e.value)


def test_a_template_that_does_not_end_is_stopped():
    import time

    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "loop.jinja").render(USER, seconds=0.5)
    assert e.value.kind == "timeout" and "still rendering after 0.5 s" in str(e.value)
    assert time.monotonic() - t0 < 5


def test_a_huge_template_is_refused():
    with pytest.raises(ChatTemplateError, match="at most 1048576 bytes"):
        ChatTemplate("x" * (2 << 20), "big.jinja")


def test_the_sandbox_hides_python_internals():
    """Attributes that lead out of the sandbox render as undefined (nothing), never as objects."""
    assert ChatTemplate("[{{ messages.__class__ }}{{ raise_exception.__globals__ }}]", "t").render(USER) == "[]"


def test_a_failed_render_leaves_the_trace_function_as_it_was():
    import sys

    before = sys.gettrace()
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ raise_exception('no') }}", "t").render(USER)
    assert sys.gettrace() is before


# -- the command line ----------------------------------------------------------------------------------
def test_cli_a_model_without_a_template_names_the_option(run):
    fails(run("generate", "--gguf", STORIES, "--chat", "--prompt", "hi"),
          "has no chat template (tokenizer.chat_template); give one with --chat-template FILE")


def test_cli_dry_run_prints_the_prompt_as_tokenized(run, tmp_path):
    """stories260K has no template: --chat-template FILE gives one; the prompt printed is the text the
    model's tokens spell, BOS (which the model adds and this template does not write) included."""
    t = tmp_path / "t.jinja"
    t.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}[assistant] {% endif %}")
    out = ok(run("generate", "--gguf", STORIES, "--chat", "--chat-template", t, "--system", "Be brief.",
                 "--prompt", "Once", "--dry-run"))
    assert out == "<s>[system] Be brief.\n[user] Once\n[assistant] "


def test_cli_messages_file_and_prompt(run, tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("{% for m in messages %}{{ m.role[0] }}:{{ m.content }};{% endfor %}")
    m = tmp_path / "m.jsonl"
    m.write_text('{"role": "user", "content": "a"}\n{"role": "assistant", "content": "b"}\n')
    out = ok(run("generate", "--gguf", STORIES, "--chat", "--chat-template", t, "--messages", m, "--prompt", "c",
                 "--dry-run"))
    assert out == "<s>u:a;a:b;u:c;"
    r = run("generate", "--gguf", STORIES, "--chat", "--chat-template", t, "--messages", m, "--temp", "0", "-n", "4",
            "--format", "json")
    assert len(json.loads(ok(r))) == 4


def test_cli_bad_role_and_raising_template(run, tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}x")
    m = tmp_path / "m.jsonl"
    m.write_text('{"role": "user", "content": "a"}\n{"role": "wizard", "content": "b"}\n')
    fails(run("generate", "--gguf", STORIES, "--chat", "--chat-template", t, "--messages", m),
          f"--messages {m} line 2: role \"wizard\" is not one of system, user, assistant, tool")
    fails(run("generate", "--gguf", STORIES, "--chat", "--chat-template", t, "--system", "s", "--prompt", "u"),
          f"{t}, line 1: the template refused the conversation: one message only")


def test_cli_chat_options_need_chat(run):
    fails(run("generate", "--gguf", STORIES, "--system", "s", "--prompt", "u"), "--system is for a conversation: add --chat",
          code=2)
    fails(run("generate", "--gguf", STORIES, "--chat", "--tokens", "[1]"), "not --tokens", code=2)
    fails(run("generate", "--gguf", STORIES, "--chat", "-i", "--prompt", "u"), "-i talks on a terminal", code=2)


def test_cli_interactive_keeps_the_cache_between_turns(tmp_path):
    """-i on a terminal: two lines typed, two replies, Ctrl-D ends; the second turn's prompt starts
    with the first turn's tokens, which the KV cache still holds (-v says how many)."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    t = tmp_path / "t.jinja"
    t.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    main, tty = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "ggtool", "generate", "--gguf", str(STORIES), "--chat",
                          "--chat-template", str(t), "-i", "--temp", "0", "-n", "6", "-v"],
                         stdin=tty, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(tty)
    err = b""

    def wait_for(n_prompts: int) -> None:   # the "> " prompts come on stderr
        nonlocal err
        deadline = time.monotonic() + 120
        while err.count(b"> ") < n_prompts and time.monotonic() < deadline:
            if select.select([p.stderr], [], [], 1)[0]:
                chunk = os.read(p.stderr.fileno(), 4096)
                if not chunk:
                    break
                err += chunk

    wait_for(1)
    os.write(main, b"Once upon a time\n")
    wait_for(2)
    os.write(main, b" there was\n")
    wait_for(3)
    os.write(main, b"\x04")
    stdout, rest = p.communicate(timeout=120)
    os.close(main)
    stderr = (err + rest).decode()
    assert p.returncode == 0, stderr
    replies = stdout.decode().splitlines()
    turns = [ln.split("turn: ")[1] for ln in stderr.splitlines() if "turn: " in ln]
    assert len(replies) == 2 and all(replies) and len(turns) == 2, (stdout, stderr)
    assert turns[0].endswith(", 0 of them from the KV cache")
    n_first = int(turns[0].split()[0])
    # the second prompt begins with the first turn's (and its reply's) tokens, kept in the cache
    assert int(turns[1].split(", ")[1].split()[0]) >= n_first - 1 > 0


def test_cli_bos_leads_once(run, tmp_path):
    """A template that writes bos_token itself (gemma's does) gets no second BOS; its ids begin with
    one BOS, as llama-cpp-python's tokenization of the rendered text (no BOS added) gives."""
    from ggtool.generate import open_model

    t = tmp_path / "t.jinja"
    t.write_text("{{ bos_token }}{{ messages[0].content }}")
    assert ok(run("generate", "--gguf", STORIES, "--chat", "--chat-template", t, "--prompt", "Once", "--dry-run")) == "<s>Once"
    model = open_model(STORIES)
    text, ids = model.chat_prompt(model.chat_template(t.read_text(), str(t)).render([{"role": "user", "content": "Once"}]))
    assert text == "<s>Once" and ids[0] == 1 and ids.count(1) == 1
