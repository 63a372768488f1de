"""The command line against hostile plumbing, through its real entry point (`python -m ggtool` in a
shell, as a user runs it): JSON nested far deeper than any input needs, and standard streams that
are closed (`<&-`, `>&-`, `2>&-`), empty or not a file. Each case ends in one clear line (or, where
nothing is wrong, the normal result), never a traceback, an internal error or a half-written output.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, STORIES

PY = [sys.executable, "-m", "ggtool"]
CLOSE = {0: "<&-", 1: ">&-", 2: "2>&-"}
DEPTH_LINE = "JSON is nested more than 64 levels deep, the most ggtool reads"


def ggtool(*args, close: tuple[int, ...] = (), input: bytes | None = None, stdin=None, cwd=ROOT):
    """`ggtool ARGS` started by a shell that first closes the standard descriptors `close`."""
    redirections = " ".join(CLOSE[fd] for fd in close)
    cmd = ["sh", "-c", f'exec "$@" {redirections}', "sh", *PY, *map(str, args)]
    return subprocess.run(cmd, input=input, stdin=stdin, capture_output=True, cwd=cwd, timeout=120)


def one_error(r, *fragments: str, code: int = 1) -> str:
    """Exit `code`, nothing on stdout, no traceback; exit 1: one `Error:` line; exit 2: click's
    usage message, its last line `Error: ...`. Each fragment is in that line."""
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == code, f"exit {r.returncode} (wanted {code})\n{err}"
    assert r.stdout == b"" and "Traceback" not in err and "internal error" not in err, err
    lines = err.strip().splitlines()
    if code == 1:
        assert len(lines) == 1, err
    line = lines[-1]
    assert line.startswith("Error: "), err
    for f in fragments:
        assert f in line, f"{f!r} not in {line!r}"
    return line


def nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


# An argument may hold 128 KiB (the kernel's MAX_ARG_STRLEN): 60,000 levels; stdin and files 100,000.
ARG_DEEP = nested(60_000)
DEEP = nested(100_000)


class TestDeepJSON:
    """JSON nested 100,000 deep (60,000 in an argument) wherever ids or arrays are read: one line
    naming the input and the limit, found without recursing (ggtool/json_input.py), never
    Python's RecursionError."""

    def test_detokenize_ids_argument(self):
        one_error(ggtool("detokenize", "--gguf", STORIES, ARG_DEEP), f"IDS: {DEPTH_LINE}")

    def test_detokenize_stdin(self):
        one_error(ggtool("detokenize", "--gguf", STORIES, input=DEEP.encode()), f"stdin: {DEPTH_LINE}")

    @pytest.mark.parametrize("command", ["detokenize", "tokenize"])
    def test_jsonl_line(self, command):
        lines = b'"Lily"\n' if command == "tokenize" else b"[1,403]\n"
        one_error(ggtool(command, "--gguf", STORIES, "--jsonl", input=lines + DEEP.encode() + b"\n"),
                  f"stdin line 2: {DEPTH_LINE}")

    def test_generate_tokens(self):
        one_error(ggtool("generate", "--gguf", STORIES, "--tokens", ARG_DEEP, "-n", "1"), f"--tokens: {DEPTH_LINE}",
                  code=2)

    def test_tensor_inline(self):
        one_error(ggtool("compute", "a", "--tensor", f"a={ARG_DEEP}"), f"--tensor a: {DEPTH_LINE}")

    def test_tensor_json_file_names_the_file(self, tmp_path):
        path = tmp_path / "deep.json"
        path.write_text(DEEP)
        one_error(ggtool("compute", "a", "--tensor", f"a={path}"), f"--tensor a: {path}: {DEPTH_LINE}")

    def test_tensor_stdin(self):
        one_error(ggtool("compute", "a", "--tensor", "a=-", input=DEEP.encode()), f"--tensor a: stdin: {DEPTH_LINE}")

    @pytest.mark.parametrize("text", ["[" * (1 << 20), '[{"a":' * (1 << 18), "[" + "[1]," * 10 + "[[[" * 100_000],
                             ids=["1 MB of [", "objects", "after valid JSON"])
    def test_a_megabyte_of_openers(self, text):
        one_error(ggtool("compute", "a", "--tensor", "a=-", input=text.encode()), DEPTH_LINE)
        one_error(ggtool("detokenize", "--gguf", STORIES, input=text.encode()), DEPTH_LINE)

    def test_the_limit_is_exact(self):
        """64 levels are read (and refused for what they are), 65 are not read."""
        one_error(ggtool("detokenize", "--gguf", STORIES, nested(63, "[1]")), "not a JSON array of token ids")
        one_error(ggtool("detokenize", "--gguf", STORIES, nested(64, "[1]")), DEPTH_LINE)
        one_error(ggtool("compute", "a", "--tensor", f"a={nested(64)}"), "more than 5 dimensions")
        one_error(ggtool("compute", "a", "--tensor", f"a={nested(65)}"), DEPTH_LINE)

    def test_brackets_inside_strings_do_not_count(self):
        """A string full of [ is not nesting: the error is what the value is."""
        text = json.dumps(["[" * 1000, 1])
        one_error(ggtool("detokenize", "--gguf", STORIES, text), "not a JSON array of token ids")
        one_error(ggtool("compute", "a", "--tensor", f"a={text}"), "is a string")


TEXT_READERS = [
    (["tokenize", "--gguf", STORIES], "the text"),
    (["tokenize", "--gguf", STORIES, "--jsonl"], "the lines"),
    (["detokenize", "--gguf", STORIES], "the token ids"),
    (["detokenize", "--gguf", STORIES, "--jsonl"], "the lines"),
    (["generate", "--gguf", STORIES, "-n", "2", "-"], "the prompt"),
    (["generate", "--gguf", STORIES, "-n", "2"], "the prompt"),
    (["compute", "-f", "-", "--tensor", "a=[1]"], "the program"),
    (["plan", "-f", "-", "--tensor", "a=[1]"], "the program"),
    (["inspect-graph", "-f", "-", "--tensor", "a=[1]"], "the program"),
    (["compute", "relu(a)", "--tensor", "a=-"], "--tensor a"),
]
RELU = ("compute", "relu(a)", "--tensor", "a=[1,-2,3]")


class TestClosedStreams:
    """stdin, stdout or stderr closed by the shell: each descriptor keeps /dev/null in its place
    (commands/_streams.py), a command that does not use the closed stream runs as usual (even
    `compute -o FILE`, which asks stdout whether it is a terminal), and a use of it is one line:
    reading stdin in every command that reads it, writing data to stdout in every command that
    writes, help and version included. Never an internal AttributeError on Python's None stream,
    nor a traceback at exit."""

    @pytest.mark.parametrize("args, what", TEXT_READERS,
                             ids=[" ".join(str(x) for x in a if x not in ("--gguf", STORIES)) for a, _ in TEXT_READERS])
    def test_closed_stdin(self, args, what):
        one_error(ggtool(*args, close=(0,)), f"stdin is closed (<&-): nothing to read {what} from")

    def test_closed_stdin_is_no_matter_when_stdin_is_not_read(self):
        r = ggtool(*RELU, close=(0,))
        assert (r.returncode, r.stdout, r.stderr) == (0, b"[1,0,3]\n", b"")

    @pytest.mark.parametrize("args", [RELU, ("compute", *RELU[1:], "--format", "npy"),
                                      ("tokenize", "--gguf", STORIES, "Lily"), ("inspect", STORIES),
                                      ("generate", "--gguf", STORIES, "--prompt", "Once", "-n", "2"),
                                      ("--help",), ("compute", "--help"), ("--version",)],
                             ids=["json", "npy", "tokenize", "inspect", "generate", "help", "command help", "version"])
    def test_closed_stdout(self, args):
        one_error(ggtool(*args, close=(1,)), "stdout is closed (>&-): the output has nowhere to go")

    def test_closed_stdout_with_an_output_file(self, tmp_path):
        out = tmp_path / "out.json"
        r = ggtool(*RELU, "-o", out, close=(1,))
        assert (r.returncode, r.stderr) == (0, b"") and out.read_text() == "[1,0,3]\n"

    def test_closed_stderr(self, tmp_path):
        """Success: the data, exit 0. Failure: exit 1, nothing else to say it with, no output left."""
        r = ggtool(*RELU, close=(2,))
        assert (r.returncode, r.stdout, r.stderr) == (0, b"[1,0,3]\n", b"")
        out = tmp_path / "out.npy"
        r = ggtool("compute", "relu(a)", "--tensor", "a=[[1],[2,3]]", "-o", out, close=(2,))
        assert (r.returncode, r.stdout, r.stderr) == (1, b"", b"") and not out.exists()
        assert list(tmp_path.iterdir()) == []

    def test_all_three_closed(self, tmp_path):
        """A descriptor the shell closed is never handed to a file ggtool opens (the model, the
        output's temporary file): /dev/null holds it, so nothing meant for stderr lands in a file."""
        out = tmp_path / "ids.json"
        r = ggtool("compute", "-f", ROOT / "fixtures" / "llama.gg", "--gguf", STORIES, "--tensor", "tokens=i32:[1,403]",
                   "--threads", "2", "-o", out, close=(0, 1, 2))
        assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")
        assert len(json.loads(out.read_text())) == 2


class TestStdinThatHoldsNothing:
    """stdin is /dev/null, or a directory, where text is needed."""

    @pytest.mark.parametrize("args, line, code", [
        (["detokenize", "--gguf", STORIES], "stdin is empty; give token ids, e.g. [1,403,407] ([] for none)", 1),
        (["generate", "--gguf", STORIES, "-n", "2"], "no prompt: stdin is empty (--prompt '' starts from the empty text)", 2),
        (["compute", "-f", "-", "--tensor", "a=[1]"], "the program computes nothing: it has no statements", 1),
        (["compute", "relu(a)", "--tensor", "a=-"], "--tensor a: stdin is empty", 1),
    ], ids=["detokenize", "generate", "compute -f -", "--tensor a=-"])
    def test_dev_null(self, args, line, code):
        """Ids or a prompt are needed: an empty stdin is an error, not an empty line (detokenize) or a
        continuation of BOS alone (generate) with exit 0."""
        with open("/dev/null", "rb") as null:
            assert one_error(ggtool(*args, stdin=null), code=code) == f"Error: {line}"

    def test_dev_null_is_the_empty_text_for_tokenize(self):
        """The empty text is a text: its ids are BOS alone (llama-tokenize's too), and --jsonl has no lines."""
        with open("/dev/null", "rb") as null:
            assert ggtool("tokenize", "--gguf", STORIES, stdin=null).stdout == b"[1]\n"
        with open("/dev/null", "rb") as null:
            r = ggtool("tokenize", "--gguf", STORIES, "--jsonl", stdin=null)
        assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")

    def test_write_only_stdin(self, tmp_path):
        """A stdin opened for writing (`0>FILE`) cannot be read: one line naming stdin."""
        with open(tmp_path / "w", "wb") as w:
            one_error(ggtool("tokenize", "--gguf", STORIES, stdin=w), "stdin cannot be read (Bad file descriptor)")

    def test_a_directory_is_refused_by_python_itself(self, tmp_path):
        """A directory on stdin stops the Python interpreter before ggtool's first line runs
        ("Fatal Python error: init_sys_streams: <stdin> is a directory"): out of ggtool's reach, but
        still no output and a failing exit status."""
        import os

        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            r = ggtool("tokenize", "--gguf", STORIES, stdin=fd)
        finally:
            os.close(fd)
        assert r.returncode != 0 and r.stdout == b"" and b"is a directory" in r.stderr
