"""Every name a module's functions read as a global is one the module defines, imports or Python
builds in: a function that names a module it never imported (bench/bench_pool.py's `ggtool.`,
imported only inside other functions) fails only when that function runs, which for a bench or a
rare error path may be never in the tests."""

from __future__ import annotations

import builtins
import symtable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULE_NAMES = {"__file__", "__name__", "__doc__", "__spec__", "__builtins__", "__loader__", "__package__", "__path__"}


def undefined_globals(source: str, filename: str = "<source>") -> list[tuple[str, int, str]]:
    """(scope, line, name) of each global a scope of `source` reads that the module never binds."""
    top = symtable.symtable(source, filename, "exec")
    symbols = top.get_symbols()
    if any(s.get_name() == "*" for s in symbols):     # `from x import *`: what it binds is unknown here
        return []
    bound = {s.get_name() for s in symbols if s.is_assigned() or s.is_imported() or s.is_namespace()}
    known = bound | MODULE_NAMES | set(dir(builtins))
    found = []

    def walk(table):
        for s in table.get_symbols():
            name = s.get_name()
            # (symtable takes a function named "top" for the module: its own bindings are excluded by hand)
            own = s.is_parameter() or s.is_assigned() or s.is_imported() or s.is_namespace()
            read_as_global = s.is_global() if table.get_type() != "module" else True
            if s.is_referenced() and read_as_global and not own and name not in known:
                found.append((table.get_name(), table.get_lineno(), name))
        for child in table.get_children():
            walk(child)

    walk(top)
    return found


def test_a_function_reading_a_global_the_module_never_binds_is_found():
    source = ("import os\n\ndef a():\n    import json\n    return json, os\n\n"
              "def b():\n    return json.dumps(len(os.sep))\n\n"
              "class C:\n    def top(cls, x):\n        y = x\n        return y, C\n")
    assert undefined_globals(source) == [("b", 7, "json")]
    assert undefined_globals("print(undefined_at_the_top)\n") == [("top", 0, "undefined_at_the_top")]


def _sources() -> list[Path]:
    files = sorted(p for folder in ("ggtool", "commands", "bench", "tests") for p in (ROOT / folder).rglob("*.py"))
    return files + sorted(ROOT.glob("*.py"))


@pytest.mark.parametrize("folder", ["ggtool", "commands", "bench", "tests"])
def test_no_module_reads_a_global_it_never_binds(folder):
    files = [p for p in _sources() if p.relative_to(ROOT).parts[0] == folder]
    assert len(files) > 3
    bad = [f"{p.relative_to(ROOT)}:{line} {scope}: {name}" for p in files
           for scope, line, name in undefined_globals(p.read_text(encoding="utf-8"), str(p))]
    assert bad == []
