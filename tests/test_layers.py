"""The engine's layers (docs/engine.md, "Layers"): every import goes down, and none closes a cycle.

Every module under ggtool/ and commands/ (installed as ggtool.commands) is parsed, not imported, and
ALL its imports count: at module level, inside functions, under `if TYPE_CHECKING:`, relative and
absolute. `from P import name` is an import of the module P.name where there is one, else of P.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top. Each layer holds one or more groups; a group is a list of modules, each with its
# submodules (the longest name that matches places a module; a name without a dot matches only
# itself, so "ggtool" is the package's own __init__.py). A module may import its own group and any
# group of a lower layer: groups of one layer know nothing of each other.
LAYERS = (
    # the ground: nothing of ggtool below them
    {"errors": ["ggtool.errors"],                         # GGToolError and its fields
     "interrupts": ["ggtool.interrupts"],                 # signals, from the command line's first line
     "blas": ["ggtool.blas"],                             # BLAS's thread count (light: the pool launches early)
     "programs": ["ggtool.programs"],                     # the DSL programs generate ships (data)
     "isolation": ["ggtool.isolation"]},                  # how ggtool starts a Python process of its own
    {"environment": ["ggtool.environment"],               # every GGTOOL_* variable, read
     "json_input": ["ggtool.json_input"]},                # JSON from the user, its nesting bounded
    {"role": ["ggtool.role"],                             # whether this process is a pool worker
     "types": ["ggtool.types"],                           # GGML's type table
     "threads": ["ggtool.threads"],                       # the one default-thread rule
     "user_regex": ["ggtool.user_regex"]},                # users' regular expressions, time-bounded
    # compiled loops and OS memory: they know types and bytes, never a tensor
    {"kernels": ["ggtool.kernels"],
     "shm": ["ggtool.pool.shm"]},                         # POSIX shared memory (the pool's, below its own layers)
    {"qtypes": ["ggtool.qtypes"]},                        # one record per GGML block type: layout, quantizers, dot
    {"compiling": ["ggtool.compiling"]},                  # when kernels compile: twins, ahead, the background compiler
    {"quant": ["ggtool.quant"]},                          # arrays of GGML's number formats
    {"tensor": ["ggtool.tensor"],                         # struct ggml_tensor; its context is a protocol
     "gguf_io": ["ggtool.gguf_io"]},                      # GGUF files: bytes and metadata, no tensors
    {"context": ["ggtool.context"],                       # ggml_init: the pool that makes tensors
     "tokenizer": ["ggtool.tokenizer"],                   # text <-> token ids from GGUF metadata
     "imatrix": ["ggtool.imatrix"]},                      # llama-imatrix's importance matrices, read
    {"graph": ["ggtool.graph"]},                          # ggml_new_graph, ggml_build_forward_expand
    {"ops": ["ggtool.ops"]},                              # builders, n_tasks, work sizes, kernels
    {"alloc": ["ggtool.alloc"]},                          # ggml_gallocr
    {"plan": ["ggtool.plan"]},                            # ggml_graph_plan
    {"runner": ["ggtool.runner"]},                        # the compiled graph runner's steps and tables
    {"compute": ["ggtool.compute"]},                      # ggml_graph_compute, in one process
    {"pool": ["ggtool.pool"],                             # ggml_graph_compute on worker processes
     "dsl": ["ggtool.dsl"]},                              # programs that build graphs
    {"tensor_io": ["ggtool.tensor_io"],                   # tensors in and out of files
     "inspect_graph": ["ggtool.inspect_graph"]},
    {"quantize_model": ["ggtool.quantize_model"],         # whole models, file to file
     "generate": ["ggtool.generate"]},                    # programs run token after token over a KV cache
    {"evaluate": ["ggtool.evaluate"]},                    # perplexity, KL divergence, imatrix over a text
    {"facade": ["ggtool"]},                               # `import ggtool`: the names, loaded on first use
    {"commands": ["ggtool.commands"]},                    # the click layer
    {"main": ["ggtool.__main__"]},                        # `python -m ggtool`: starts workers, runs the CLI
)

# Names of LAYERS whose module does not exist yet: each leaves this set once its module exists (the
# test fails while a name here exists, or while a name of LAYERS matches no module and is not here).
ARRIVING: set[str] = set()

# Imports known to break the layers for now: the test fails as soon as a pair here no longer breaks
# anything (it is gone, or no longer goes up or round), so the list cannot outlive its cause.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()

# The one module under ggtool/ that imports the command line: the entry point of `python -m ggtool`.
ENTRY_POINT = "ggtool.__main__"


# -- reading the tree ---------------------------------------------------------------------------------
@cache
def modules() -> dict[str, Path]:
    """Module name -> file, for ggtool/ and commands/ (as ggtool.commands)."""
    found = {}
    for top, package in (("ggtool", ["ggtool"]), ("commands", ["ggtool", "commands"])):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = package + list(path.relative_to(ROOT / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _package(name: str) -> str:
    """The package a module belongs to: itself for a package's __init__.py, else its parent."""
    return name if modules()[name].name == "__init__.py" else name.rpartition(".")[0]


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module
    base = _package(importer).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def imports() -> dict[str, list[tuple[str, str, int]]]:
    """Module -> [(imported module, name taken or "", line)], every import of the module's source."""
    known = modules()
    found = {}
    for name, path in known.items():
        rows = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                rows += [(a.name, "", node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, node)
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    rows.append((sub, "", node.lineno) if sub in known else (target, a.name, node.lineno))
        found[name] = rows
    return found


@cache
def edges() -> set[tuple[str, str]]:
    """(importer, imported) between modules of the tree."""
    known = modules()
    return {(a, b) for a, rows in imports().items() for b, _, _ in rows if b in known and b != a}


# -- the layers ---------------------------------------------------------------------------------------
def _matches(pattern: str, name: str) -> bool:
    return name == pattern or ("." in pattern and name.startswith(pattern + "."))


@cache
def placement(name: str) -> tuple[int, str] | None:
    """(layer index, group) of a module, or None if LAYERS does not place it."""
    best = None
    for index, layer in enumerate(LAYERS):
        for group, patterns in layer.items():
            for p in patterns:
                if _matches(p, name) and (best is None or len(p) > best[0]):
                    best = (len(p), index, group)
    return None if best is None else best[1:]


def _goes_down(a: str, b: str) -> bool:
    (la, ga), (lb, gb) = placement(a), placement(b)
    return ga == gb or la > lb


def _cycles(pairs: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(pairs):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _where(a: str, b: str) -> str:
    lines = sorted({line for m, _, line in imports()[a] if m == b})
    return f"{modules()[a].relative_to(ROOT)}:{','.join(map(str, lines))} imports {b}"


# -- the tests ----------------------------------------------------------------------------------------
def test_every_module_has_a_layer():
    unplaced = sorted(m for m in modules() if placement(m) is None)
    assert not unplaced, f"place these modules in LAYERS (tests/test_layers.py, docs/engine.md): {unplaced}"


def test_every_name_of_the_table_is_a_module():
    """A name of LAYERS that matches nothing is a module that moved or went: the table follows it."""
    names = [p for layer in LAYERS for patterns in layer.values() for p in patterns]
    assert len(names) == len(set(names))
    stale = sorted(p for p in names if p not in ARRIVING and not any(_matches(p, m) for m in modules()))
    arrived = sorted(p for p in ARRIVING if any(_matches(p, m) for m in modules()))
    assert not stale, f"no module matches {stale}: remove them from LAYERS"
    assert not arrived, f"{arrived} exist now: remove them from ARRIVING"


def test_imports_go_down_only():
    up = sorted((a, b) for a, b in edges() - KNOWN_VIOLATIONS if not _goes_down(a, b))
    assert not up, "imports that go up a layer, or across to a group of the same layer:\n" + "\n".join(
        f"  {_where(a, b)} ({placement(a)} -> {placement(b)})" for a, b in up)


def test_no_import_cycle():
    cycles = _cycles(edges() - KNOWN_VIOLATIONS)
    assert not cycles, "modules that import each other:\n" + "\n".join(f"  {c}" for c in cycles)


def test_known_violations_still_break_the_layers():
    """Each pair of KNOWN_VIOLATIONS is an import that goes up or closes a cycle: once it does not,
    it comes off the list."""
    in_cycle = {m: i for i, comp in enumerate(_cycles(edges())) for m in comp}
    for a, b in sorted(KNOWN_VIOLATIONS):
        assert (a, b) in edges(), f"{a} no longer imports {b}: remove the pair from KNOWN_VIOLATIONS"
        cyclic = a in in_cycle and in_cycle.get(b) == in_cycle[a]
        assert cyclic or not _goes_down(a, b), f"{a} -> {b} breaks nothing now: remove it from KNOWN_VIOLATIONS"


@pytest.mark.parametrize("forbidden", ["click", "ggtool.commands"])
def test_the_engine_never_imports_the_command_line(forbidden):
    engine = [m for m in modules() if not _matches("ggtool.commands", m) and m != ENTRY_POINT]
    found = sorted(_where(a, b) for a in engine for b, _, _ in imports()[a] if _matches(forbidden, b))
    assert not found, found


def _private_uses(name: str) -> list[tuple[str, str, int]]:
    """(module, private name, line) this module takes from other modules: `from M import _x`, and
    `M._x` where M is a name the module bound to an imported module of ggtool or gguf-py. (The
    standard library's few, such as atexit._run_exitfuncs, have no public form.)"""
    known = modules()
    tree = ast.parse(known[name].read_text(encoding="utf-8"))
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.partition(".")[0] in ("ggtool", "gguf"):
                    aliases[a.asname or a.name.partition(".")[0]] = a.name if a.asname else a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node)
            for a in node.names:
                if f"{target}.{a.name}" in known or target.startswith("gguf"):
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append((target, a.name, node.lineno))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append((aliases[node.value.id], node.attr, node.lineno))
    return found


def test_no_private_name_crosses_a_package():
    """A name another package uses is public: `_x` is for its own package."""
    known = modules()
    crossing = []
    for name in known:
        for target, attr, line in _private_uses(name):
            owner = _package(target) if target in known else target
            if owner != _package(name):
                crossing.append(f"{known[name].relative_to(ROOT)}:{line} uses {target}.{attr}")
    assert not crossing, crossing


def test_the_checks_can_fail():
    """The tools the tests rely on see what they must: an upward import, a cycle, a private name."""
    assert not _goes_down("ggtool.graph", "ggtool.compute") and _goes_down("ggtool.compute", "ggtool.graph")
    assert not _goes_down("ggtool.pool.caller", "ggtool.dsl.evaluate")      # siblings of one layer
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    assert ("ggtool.context", "ggtool.tensor") in edges()                   # module level
    assert ("ggtool.tensor", "ggtool.quant") in edges()                     # inside a function
    assert placement("ggtool") == (len(LAYERS) - 3, "facade") and placement("ggtool.ops.base")[1] == "ops"
