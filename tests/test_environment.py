"""The GGTOOL_* environment variables: one list (ggtool/environment.py), the only module that reads
them, rendered in docs/cli.md#environment; and their parsers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ggtool import environment as E
from ggtool.errors import GGToolError

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "ggtool" / "environment.py"
NAME = re.compile(r"\bGGTOOL_[A-Z0-9_]*[A-Z0-9]\b")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".gg"}


def _text_files():
    """The tree's source and documentation: the engine, the command line, tests, benches, docs,
    CI scripts, the README and pyproject.toml (test data under tests/golden is not text)."""
    yield from (ROOT / "README.md", ROOT / "pyproject.toml")
    for top in ("ggtool", "commands", "tests", "bench", "docs", "fixtures"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "golden" not in p.parts:
                yield p
    for p in sorted((ROOT / ".ci").glob("*")):
        if p.is_file():
            yield p


def _names_in(path: Path) -> set[str]:
    return set(NAME.findall(path.read_text(encoding="utf-8", errors="replace")))


def test_every_ggtool_variable_in_the_tree_is_on_the_list():
    unknown = {}
    for path in _text_files():
        for name in _names_in(path) - set(E.BY_NAME):
            unknown.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not unknown, f"add these to ggtool/environment.py (or rename them): {unknown}"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (documentation, not keys)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            found.add(id(body[0].value))
    return found


def _is_environ(node: ast.AST) -> bool:
    """`os.environ` (or `environ` imported from os)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name)
                                                                             and node.id == "environ")


def reads_elsewhere(source: str) -> list[str]:
    """What in a module outside ggtool/environment.py reads a GGTOOL_* variable itself: a string
    that is a variable's name (a key: only environment.py spells them), or a read of os.environ
    (get, [ ], in, getenv, pop, setdefault) whose key is not a plain string naming another
    program's variable (NUMBA_CACHE_DIR, XDG_CACHE_HOME, ...)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []

    def key_ok(key: ast.AST) -> bool:
        return isinstance(key, ast.Constant) and isinstance(key.value, str) and not key.value.startswith("GGTOOL_")

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and NAME.fullmatch(node.value.strip()):
            found.append(f"line {node.lineno}: the name {node.value!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            env_call = _is_environ(f.value) and f.attr in ("get", "pop", "setdefault")
            getenv = f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"
            if (env_call or getenv) and node.args and not key_ok(node.args[0]):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load) \
                and not key_ok(node.slice):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators) \
                and not key_ok(node.left):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_environment_module_reads_them():
    found = {}
    for top in ("ggtool", "commands"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path != HOME:
                hits = reads_elsewhere(path.read_text(encoding="utf-8"))
                if hits:
                    found[str(path.relative_to(ROOT))] = hits
    assert not found, f"read these through ggtool.environment: {found}"


def test_the_check_sees_what_it_must():
    """The reads it exists to find, and what it must leave alone."""
    assert reads_elsewhere('import os\nv = os.environ.get("GGTOOL_FORK")\n')
    assert reads_elsewhere('import os\nNAME = "GGTOOL_THREADS"\nv = os.environ.get(NAME, "")\n') == [
        "line 2: the name 'GGTOOL_THREADS'", "line 3: os.environ.get(NAME, '')"]
    assert reads_elsewhere('import os\nv = os.getenv(name)\n') and reads_elsewhere('import os\nv = os.environ[k]\n')
    assert reads_elsewhere('import os\nv = k in os.environ\n')
    assert not reads_elsewhere('"""GGTOOL_DEBUG=1 shows the traceback."""\nimport os\n'
                               'v = os.environ.get("NUMBA_CACHE_DIR")\nos.environ["X"] = "1"\n')


def test_each_variable_is_documented_and_distinct():
    assert len(E.BY_NAME) == len(E.VARIABLES)
    for v in E.VARIABLES:
        assert NAME.fullmatch(v.name) and v.meaning.endswith(".") and v.default and callable(v.parse), v


DOC = ROOT / "docs" / "cli.md"


def render() -> list[str]:
    """The list as docs/cli.md's table shows it."""
    return ["| variable | what it does | unset |", "|---|---|---|"] + [
        f"| `{v.name}` | {v.meaning} | {v.default} |" for v in E.VARIABLES]


def test_the_docs_table_is_the_list():
    text = DOC.read_text(encoding="utf-8")
    begin, end = text.index("<!-- environment:begin"), text.index("<!-- environment:end -->")
    table = text[begin:end].splitlines()[1:]
    assert [ln for ln in table if ln.strip()] == render(), "docs/cli.md#environment: paste tests/test_environment.render()"


# -- the parsers ----------------------------------------------------------------------------------------
def test_unset_and_blank_are_the_default(monkeypatch):
    for v in E.VARIABLES:
        monkeypatch.delenv(v.name, raising=False)
        assert v.read() is None and v.text() is None
        monkeypatch.setenv(v.name, "  ")
        assert v.read() is None
    assert (E.place(), E.fork(), E.debug(), E.pool_worker()) == (True, True, False, False)


def test_counts(monkeypatch):
    monkeypatch.setenv("GGTOOL_THREADS", " 3 ")
    assert E.threads() == 3 and E.read("GGTOOL_THREADS") == 3
    for bad in ("0", "-2", "zero", "2.5"):
        monkeypatch.setenv("GGTOOL_QUANT_THREADS", bad)
        with pytest.raises(GGToolError, match=f"GGTOOL_QUANT_THREADS must be a positive integer, got '{re.escape(bad)}'"):
            E.quant_threads()


@pytest.mark.parametrize("text, value", [
    ("2G", 2 << 30), ("2GB", 2 << 30), ("2GiB", 2 << 30), ("1.5g", 3 << 29), ("512M", 512 << 20), ("3k", 3072),
    ("1000000", 1000000), ("100B", 100), ("0", 0), ("1T", 1 << 40)])
def test_sizes(monkeypatch, text, value):
    monkeypatch.setenv("GGTOOL_CACHE_MAX", text)
    assert E.cache_max() == value


@pytest.mark.parametrize("text", ["G", "x", "-1", "nan", "inf", "1e30T", "2 G B", "2X"])
def test_bad_sizes_name_the_variable(monkeypatch, text):
    monkeypatch.setenv("GGTOOL_CACHE_MAX", text)
    with pytest.raises(GGToolError, match="GGTOOL_CACHE_MAX must be a size such as 2G"):
        E.cache_max()


def test_cpu_flags_and_switches(monkeypatch):
    monkeypatch.setenv("GGTOOL_CPU_FLAGS", "AVX2, fma f16c,,sse4_2")
    assert E.cpu_flags() == frozenset({"avx2", "fma", "f16c", "sse4_2"})
    monkeypatch.setenv("GGTOOL_CACHE_DIR", "/some/where")
    assert E.cache_dir() == "/some/where"
    for name, reader in (("GGTOOL_PLACE", E.place), ("GGTOOL_FORK", E.fork)):
        monkeypatch.setenv(name, "0")
        assert reader() is False
        monkeypatch.setenv(name, "1")
        assert reader() is True
    for name, reader in (("GGTOOL_DEBUG", E.debug), ("GGTOOL_POOL_WORKER", E.pool_worker)):
        monkeypatch.setenv(name, "yes")
        assert reader() is True


@pytest.mark.parametrize("name, args, code, message", [
    # every variable is read once before a command runs (environment.check): one line, exit 1
    ("GGTOOL_THREADS", ["plan", "relu(a)", "--tensor", "a=f32[4]"], 1,
     "GGTOOL_THREADS must be a positive integer, got 'zero'"),
    # the engine reads GGTOOL_QUANT_THREADS when a q4_0 conversion quantizes
    ("GGTOOL_QUANT_THREADS", ["compute", "a", "--tensor", f"a=q4_0:{list(range(32))}"], 1,
     "GGTOOL_QUANT_THREADS must be a positive integer, got 'zero'"),
])
def test_a_bad_value_is_one_clear_error_on_the_command_line(name, args, code, message):
    import os
    import subprocess
    import sys

    env = {**os.environ, name: "zero"}
    r = subprocess.run([sys.executable, "-m", "ggtool", *args], env=env, capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    assert (r.returncode, r.stdout) == (code, "") and "Traceback" not in r.stderr
    assert message in r.stderr and r.stderr.strip().splitlines()[-1].startswith("Error: ")
