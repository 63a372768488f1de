"""Run a parsed program against a Context: statements create tensors (and scalars), then one graph
is made and expanded with each output, in order."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from .. import types as T
from ..context import Context
from ..errors import GGToolError
from ..graph import DEFAULT_GRAPH_SIZE, Graph
from ..ops.base import FUNCTIONS
from ..tensor import FLAG_PARAM, Tensor
from .builtins import BUILTINS, BuiltinError, describe, is_number
from .env import DictEnv, Env
from .errors import DSLError, suggest
from .nodes import Assign, BinOp, Call, ExprStmt, For, Name, Neg, Null, Num, Program, Str, TypeWord
from .parser import parse

_P = inspect.Parameter
_TENSOR_HINT = {"+": "add(a, b)", "-": "sub(a, b)", "*": "mul(a, b) or scale(a, s)", "/": "div(a, b)"}


@dataclass
class Built:
    graph: Graph
    outputs: list[tuple[str, Tensor]]     # (name, tensor) in the order they were expanded
    tensors: dict[str, Tensor]            # every tensor the program named, and every input it used
    variables: dict[str, Any] = field(default_factory=dict)  # final value of every variable
    notes: list[str] = field(default_factory=list)           # things worth telling the user


def build(program: Program | str, ctx: Context, env: Env | None = None, outputs=None,
          graph_size: int | None = None) -> Built:
    """Create the program's tensors in ctx and a graph holding its outputs.

    outputs: names (variables, tensor names such as `x-3` from loops, or inputs); None means the
    last statement executed. graph_size: None means GGML's default 2048, grown if the graph needs it.
    """
    if isinstance(program, str):
        program = parse(program)
    ev = Evaluator(program, ctx, env if env is not None else DictEnv())
    ev.run()
    outs = ev.resolve_outputs(outputs)
    size, notes = _graph_size(outs, graph_size)
    graph = ctx.new_graph(size)
    for _, t in outs:
        graph.expand(t)
    return Built(graph, outs, {**ev.inputs, **ev.named}, dict(ev.vars), notes)


def _graph_size(outs, forced: int | None) -> tuple[int, list[str]]:
    """Count what expanding the outputs will add, so the graph can be made big enough up front."""
    seen: set[int] = set()
    nodes = leafs = 0
    stack = [t for _, t in outs]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.op == "NONE" and not t.flags & FLAG_PARAM:
            leafs += 1
        else:
            nodes += 1
        stack.extend(s for s in t.src if s is not None)
    needed = max(nodes, leafs)
    if forced is not None:
        if forced < needed:
            raise DSLError(f"graph size {forced} is too small: the program has {nodes} nodes and {leafs} leafs "
                           f"(each must fit in the size)")
        return forced, []
    if needed <= DEFAULT_GRAPH_SIZE:
        return DEFAULT_GRAPH_SIZE, []
    size = DEFAULT_GRAPH_SIZE
    while size < needed:
        size *= 2
    note = (f"graph size {size} instead of GGML's default {DEFAULT_GRAPH_SIZE}: "
            f"the program has {nodes} nodes and {leafs} leafs")
    return size, [note]


class Evaluator:
    def __init__(self, program: Program, ctx: Context, env: Env):
        self.program, self.ctx, self.env = program, ctx, env
        self.vars: dict[str, Any] = {}
        self.inputs: dict[str, Tensor] = {}   # input tensors used, by name
        self.named: dict[str, Tensor] = {}    # tensors named by assignments, by their GGML name
        self.loops: list[tuple[str, int]] = []
        self.last: tuple[str, Any, Any] | None = None  # (output name, value, statement)

    def error(self, msg: str, node) -> DSLError:
        line, col = getattr(node, "pos", (0, 0)) or (0, 0)
        loop = ", ".join(f"{v}={i}" for v, i in self.loops) or None
        if not line:
            return DSLError(msg, loop=loop, filename=self.program.filename)
        return DSLError(msg, line, col, self.program.source, self.program.filename, loop)

    # -- statements -------------------------------------------------------------------------
    def run(self) -> None:
        self.block(self.program.body)

    def block(self, body) -> None:
        for s in body:
            if isinstance(s, For):
                self.loop(s)
            elif isinstance(s, Assign):
                self.assign(s)
            elif isinstance(s, ExprStmt):
                value = self.eval(s.value)
                name = self.name_of(s.value) if isinstance(s.value, Name) else "result"
                self.last = (name, value, s)
            else:
                raise TypeError(f"not a statement: {s!r}")

    def assign(self, s: Assign) -> None:
        n0 = len(self.ctx.tensors)
        value = self.eval(s.value)
        target = self.name_of(s.target)
        if isinstance(value, Tensor) and isinstance(s.value, Call) and self._new(value, n0):
            # ggml_set_name; inside loops llama.cpp-style "name-il" unless the name has {...}
            gname = target
            if self.loops and s.target.plain is not None:
                gname += "".join(f"-{i}" for _, i in self.loops)
            value.name = gname
            self.named[gname] = value
        self.vars[target] = value
        self.last = (target, value, s)

    def _new(self, t: Tensor, n0: int) -> bool:
        """Was t created by this statement (so naming it renames nothing else)?"""
        return (any(x is t for x in self.ctx.tensors[n0:])
                and not any(x is t for x in self.inputs.values()))

    def loop(self, s: For) -> None:
        args = [self.eval(a) for a in s.range_args]
        for a, node in zip(args, s.range_args):
            if not is_number(a) or isinstance(a, float):
                raise self.error(f"range() needs integers, got {describe(a)}", node)
        if len(args) == 3 and args[2] == 0:
            raise self.error("range() step must not be zero", s.range_args[2])
        for i in range(*args):
            self.vars[s.var] = i
            self.loops.append((s.var, i))
            try:
                self.block(s.body)
            finally:
                self.loops.pop()

    # -- expressions ------------------------------------------------------------------------
    def eval(self, e):
        if isinstance(e, Num):
            return e.value
        if isinstance(e, Name):
            return self.lookup(e)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, BinOp):
            return self.binop(e)
        if isinstance(e, Str):
            return "".join(p if isinstance(p, str) else self.interp(p) for p in e.parts)
        if isinstance(e, TypeWord):
            try:
                return T.parse_type(e.name)
            except GGToolError as exc:
                raise self.error(str(exc), e) from None
        if isinstance(e, Null):
            return None
        if isinstance(e, Neg):
            v = self.eval(e.operand)
            if not is_number(v):
                hint = "; for a tensor use neg(x) or scale(x, -1)" if isinstance(v, Tensor) else ""
                raise self.error(f"unary '-' needs a number, got {describe(v)}{hint}", e.operand)
            return -v
        raise TypeError(f"not an expression: {e!r}")

    def name_of(self, n: Name) -> str:
        return "".join(p if isinstance(p, str) else self.interp(p) for p in n.parts)

    def interp(self, e) -> str:
        v = self.eval(e)
        if isinstance(v, T.GGMLType):
            return T.type_name(v)
        if isinstance(v, str):
            return v
        if is_number(v):
            return str(v)
        raise self.error(f"can't put {describe(v)} into a name or string: only numbers, strings and types", e)

    def lookup(self, n: Name):
        name = self.name_of(n)
        if name in self.vars:
            return self.vars[name]
        t = self.input(name, n)
        if t is not None:
            return t
        kind = "tensor" if ("." in name or n.plain is None) else "tensor or variable"
        raise self.error(f"unknown {kind} '{name}'{suggest(name, [*self.vars, *self.env.names()])}", n)

    def input(self, name: str, node=None) -> Tensor | None:
        if name in self.inputs:
            return self.inputs[name]
        try:
            t = self.env.tensor(name, self.ctx)
        except DSLError:
            raise
        except GGToolError as exc:
            raise self.error(f"input '{name}': {exc}", node) from exc
        if t is not None:
            self.inputs[name] = t
        return t

    def binop(self, e: BinOp):
        a, b = self.eval(e.left), self.eval(e.right)
        for v, side in ((a, e.left), (b, e.right)):
            if not is_number(v):
                hint = ""
                if isinstance(v, Tensor) and e.op in _TENSOR_HINT:
                    hint = f"; for tensors use {_TENSOR_HINT[e.op]}"
                elif isinstance(v, str):
                    hint = '; build strings with interpolation: "{a}{b}"'
                raise self.error(f"'{e.op}' needs numbers, got {describe(v)}{hint}", side)
        if e.op in ("/", "//", "%") and b == 0:
            raise self.error(f"division by zero in '{e.op}'", e)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.op == "/":
            return a / b
        if e.op == "//":
            return a // b
        return a % b

    # -- calls ------------------------------------------------------------------------------
    def call(self, c: Call):
        b, f = BUILTINS.get(c.func), FUNCTIONS.get(c.func)
        if b is None and f is None:
            raise self.error(f"unknown op '{c.func}'{suggest(c.func, [*FUNCTIONS, *BUILTINS])}", c)
        args = [self.eval(a) for a in c.args]
        kwargs = {k.name: self.eval(k.value) for k in c.kwargs}
        if b is not None and not (b.scalar_math and f is not None
                                  and any(isinstance(v, Tensor) for v in [*args, *kwargs.values()])):
            self.check_args(b.fn, b.signature, c, args, kwargs)
            try:
                return b.fn(self, *args, **kwargs)
            except BuiltinError as exc:
                at = c.args[exc.arg] if exc.arg is not None and exc.arg < len(c.args) else c
                raise self.error(str(exc), at) from None
            except DSLError:
                raise
            except GGToolError as exc:
                raise self.error(str(exc), c) from exc
        self.check_args(f.build, f.signature, c, args, kwargs)
        try:
            t = f(self.ctx, *args, **kwargs)
        except DSLError:
            raise
        except GGToolError as exc:  # ShapeError etc.: the op's own message, at the call
            raise self.error(str(exc), c) from exc
        except Exception as exc:  # a builder tripping over a value of the wrong kind
            got = ", ".join([describe(v) for v in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()])
            raise self.error(f"{c.func}() can't use these arguments ({got}): {type(exc).__name__}: {exc}; "
                             f"expected {f.signature}", c) from exc
        if not isinstance(t, Tensor):
            raise self.error(f"op {c.func} returned {describe(t)}, not a tensor", c)
        return t

    def check_args(self, fn, signature: str, c: Call, args: list, kwargs: dict) -> None:
        """Python's own binding rules, reported in GGML's terms (the C signature)."""
        params = list(inspect.signature(fn).parameters.values())[1:]  # without ctx
        named = [p.name for p in params if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)]
        positional = [p for p in params if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
        varpos = any(p.kind == _P.VAR_POSITIONAL for p in params)
        varkw = any(p.kind == _P.VAR_KEYWORD for p in params)
        for k in c.kwargs:
            if k.name not in named and not varkw:
                valid = ", ".join(named) if named else "none"
                raise self.error(f"{c.func}() has no parameter '{k.name}'{suggest(k.name, named)}; "
                                 f"valid keywords: {valid} ({signature})", k)
            idx = next((i for i, p in enumerate(positional) if p.name == k.name), None)
            if idx is not None and idx < len(args):
                raise self.error(f"{c.func}() got argument '{k.name}' twice (by position and by keyword)", k)
        nmin = sum(1 for p in positional if p.default is _P.empty)
        nmax = len(positional)
        if not varpos and len(args) > nmax or (not kwargs and len(args) < nmin):
            want = f"{nmin}" if nmin == nmax else f"{nmin} to {nmax}"
            if varpos:
                want = f"at least {nmin}"
            s = "" if want == "1" else "s"
            raise self.error(f"{c.func}() takes {want} argument{s}, got {len(args)}: {signature}", c)
        missing = [p.name for i, p in enumerate(params)
                   if p.default is _P.empty and p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)
                   and p.name not in kwargs and not (i < len(args) and p.kind != _P.KEYWORD_ONLY)]
        if missing:
            s = "" if len(missing) == 1 else "s"
            raise self.error(f"{c.func}() is missing argument{s} {', '.join(repr(m) for m in missing)}: {signature}",
                             c)

    # -- outputs ----------------------------------------------------------------------------
    def resolve_outputs(self, names) -> list[tuple[str, Tensor]]:
        if names is None:
            if self.last is None:
                raise DSLError("the program computes nothing: it has no statements",
                               filename=self.program.filename)
            name, value, stmt = self.last
            if not isinstance(value, Tensor):
                raise self.error(f"the program's result '{name}' is {describe(value)}, not a tensor; "
                                 "end the program with a tensor or ask for outputs by name", stmt)
            return [(name, value)]
        if isinstance(names, str):
            names = [names]
        outs = []
        for name in names:
            if name in self.vars:
                value = self.vars[name]
                if not isinstance(value, Tensor):
                    raise DSLError(f"output '{name}' is {describe(value)}, not a tensor")
            elif name in self.named:
                value = self.named[name]
            else:
                value = self.input(name)
            if value is None:
                known = [k for k, v in self.vars.items() if isinstance(v, Tensor)]
                raise DSLError(f"unknown output '{name}'"
                               f"{suggest(name, [*known, *self.named, *self.env.names()])}")
            outs.append((name, value))
        return outs
