"""Each command's --help says only what that command takes: no option of another command, and no
tensor sources (inline JSON, shape-only sources) for a command without --tensor. (stdin is not
one of --tensor's words: tokenize and detokenize read their own TEXT and IDS from it.)"""

from __future__ import annotations

import re

import pytest
from conftest import ok
from ggtool.commands import cli

COMMANDS = cli.list_commands(None)
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")
SOURCE_WORDS = ("JSON [", "Shape-only", "shape-only", "f32[", "--tensor")   # what only --tensor takes


def own_options(name: str) -> set[str]:
    command = cli.get_command(None, name)
    return {"--help"} | {o for p in command.params for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_only_the_commands_own_options(run, name):
    out = ok(run(name, "--help"))
    assert set(OPTION.findall(out)) <= own_options(name), sorted(set(OPTION.findall(out)) - own_options(name))


@pytest.mark.parametrize("name", [n for n in COMMANDS if "--tensor" not in own_options(n)])
def test_help_of_a_command_without_tensor_sources_does_not_describe_them(run, name):
    out = " ".join(ok(run(name, "--help")).split())
    # "--tensor" as a whole option (quantize's --tensor-type is another)
    assert [w for w in SOURCE_WORDS if (re.search(r"--tensor(?![\w-])", out) if w == "--tensor" else w in out)] == []


def test_the_commands_that_read_files_only_are_checked():
    """The check above has something to check: quantize, compare and inspect take no --tensor."""
    assert {"quantize", "compare", "inspect"} <= {n for n in COMMANDS if "--tensor" not in own_options(n)}
