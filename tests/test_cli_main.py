"""The `ggtool` group: help everywhere, `python -m ggtool`, broken pipes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, ok
from ggtool.commands import SUBCOMMANDS, cli

COMMANDS = cli.list_commands(None)


def test_every_module_is_registered():
    """Every command module loads and is reachable under its listed name."""
    assert len(COMMANDS) == len(SUBCOMMANDS)
    for name in COMMANDS:
        assert cli.get_command(None, name).name == name


@pytest.mark.parametrize("name", COMMANDS)
def test_help_has_an_example(run, name):
    """Project rule: every command's --help has a worked example and teaches numpy vs GGML order
    (commands._common.NUMPY_ORDER_HELP says it; `ops`, `tokenize`, `detokenize`, `generate`, `perplexity`,
    `imatrix`, `sweep` and `kernels` handle no tensors, `set-metadata` copies them as bytes)."""
    out = ok(run(name, "--help"))
    assert out.startswith(f"Usage: ggtool {name} ")
    assert "Example" in out and "$ ggtool " in out
    if name not in ("ops", "set-metadata", "tokenize", "detokenize", "generate", "perplexity", "imatrix",
                    "sweep", "kernels"):
        assert "numpy shape (d3, d2, d1, d0) is GGML ne = [d0, d1, d2, d3]" in " ".join(out.split())


def test_group_help_and_version(run):
    out = ok(run("--help"))
    assert "[[60,55,50,110],[90,54,54,126],[42,29,28,64]]" in out
    assert all(name in out for name in COMMANDS)
    assert "ggtool, version" in ok(run("--version"))


def test_unknown_command_is_usage_error(run):
    r = run("frobnicate")
    assert r.exit_code == 2 and "No such command" in r.stderr and r.stdout == ""


def test_python_dash_m():
    r = subprocess.run([sys.executable, "-m", "ggtool", "--help"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("Usage: ggtool") and r.stderr == ""


def test_python_dash_m_exit_codes_and_output():
    """The process ends right after its exit handlers (ggtool/__main__.py): the exit status, the
    data on stdout and the message on stderr all survive it."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "ggtool", *args], capture_output=True, text=True, cwd=ROOT,
                              timeout=60)

    r = run("compute", "add(a, b)", "--tensor", "a=[1,2]", "--tensor", "b=[3,4]")
    assert (r.returncode, r.stdout, r.stderr) == (0, "[4,6]\n", "")
    r = run("compute", "add(a, b)", "--tensor", "a=[1,2]")
    assert r.returncode == 1 and r.stdout == "" and "b" in r.stderr and "Traceback" not in r.stderr
    r = run("compute", "--no-such-option")
    assert r.returncode == 2 and "No such option" in r.stderr


def test_under_a_profiler_the_process_ends_normally():
    """cProfile prints its report when the program returns: ggtool then exits the usual way."""
    r = subprocess.run([sys.executable, "-m", "cProfile", "-m", "ggtool", "compute", "neg(a)", "--tensor", "a=[1]"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("[-1]\n") and "function calls" in r.stdout


def test_broken_pipe_is_quiet():
    """`ggtool compute ... | head -c 1`: no traceback, no message, exit 141 (128 + SIGPIPE), as a C
    tool (tests/test_cli_signals.py has every command and format)."""
    code = "import sys; from ggtool.commands import main; sys.argv = ['ggtool'] + sys.argv[1:]; main()"
    with subprocess.Popen([sys.executable, "-c", code, "compute", "relu(x)", "--tensor", "x=f32[1000,1000]"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT) as p:
        assert p.stdout.read(1) == b"["
        p.stdout.close()
        err = p.stderr.read().decode()
        p.wait(timeout=60)
    assert err == ""
    assert p.returncode == 141


def help_example(text: str) -> tuple[list[str], str]:
    """The first `$ ggtool ...` command of a help text's Example block and the output shown under it."""
    import shlex

    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip().startswith("$ ggtool"))
    command = lines[i].strip()[2:]
    while command.endswith("\\"):
        i += 1
        command = command[:-1] + lines[i].strip()
    out = []
    for line in lines[i + 1:]:
        if not line.strip():
            break
        out.append(line[4:])
    return shlex.split(command)[1:], "\n".join(out) + "\n"


@pytest.mark.parametrize("name", ["compute", "inspect-graph", "plan"])
def test_help_examples_are_real(run, name):
    args, shown = help_example(ok(run(name, "--help")))
    assert ok(run(*args)) == shown
