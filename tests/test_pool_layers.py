"""The worker pool's modules import downward only (function-level imports included): each module
of ggtool/pool/ imports only those below it in LAYERS, so the package has no import cycle; and the
pool never speaks the command line's language (argv, option names)."""

from __future__ import annotations

import ast
from pathlib import Path

import ggtool.pool

POOL = Path(ggtool.pool.__file__).parent
# top to bottom: a module may import those after it, never those before it
LAYERS = ["__init__", "caller", "procs", "launch", "fork", "worker", "barrier", "wire", "segments", "shm", "placement"]


def pool_imports(path: Path) -> set[str]:
    """The ggtool.pool modules `path` imports, wherever the import statement stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:        # from . import x / from .x import y
                found.update([node.module] if node.module else [a.name for a in node.names])
            elif node.level == 0 and node.module and node.module.startswith("ggtool.pool"):
                rest = node.module[len("ggtool.pool"):].lstrip(".")
                found.update([rest] if rest else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name[len("ggtool.pool."):] for a in node.names if a.name.startswith("ggtool.pool."))
    return {m.split(".")[0] for m in found}


def test_every_pool_module_has_a_layer():
    assert sorted(p.stem for p in POOL.glob("*.py")) == sorted(LAYERS)


def test_pool_modules_import_downward_only():
    upward = []
    for i, name in enumerate(LAYERS):
        for target in pool_imports(POOL / f"{name}.py"):
            if target not in LAYERS[i + 1:]:
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_the_pool_reads_no_argv():
    """(That no string under ggtool/ names an option is test_cli_wording's check.)"""
    for path in POOL.glob("*.py"):
        tree = ast.parse(path.read_text())
        argv = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "argv"]
        assert path.stem == "worker" or not argv, path.name   # a fresh worker gets its descriptors as argv
