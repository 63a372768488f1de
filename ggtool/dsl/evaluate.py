"""Run a parsed program against a Context: statements create tensors (and scalars), then one graph
is made and expanded with each output, in order.

Scopes: the program's variables are global; a function call (`def`) runs its body with its own
variables (the parameters and what the body assigns), reading globals it does not shadow.
`include "file"` runs another file's statements in the global scope, once per file.
"""

from __future__ import annotations

import inspect
import operator
import os
import stat
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
from .errors import DSLError, StepLimitError, UnknownOutputError, suggest
from .limits import (
    INCLUDE_SUFFIX,
    INT64_MAX,
    INT64_MIN,
    INT64_RANGE,
    MAX_CALL_DEPTH,
    MAX_INCLUDE_DEPTH,
    MAX_RUN_DEPTH,
    MAX_SOURCE_BYTES,
    MAX_STEPS,
    MAX_STRING,
    int_out_of_range,
    overflowed,
    shown,
)
from .nodes import (
    Assign,
    BinOp,
    BoolOp,
    Call,
    Compare,
    Def,
    ExprStmt,
    For,
    If,
    Include,
    Index,
    Name,
    Neg,
    Not,
    Null,
    Num,
    Program,
    Return,
    Str,
    TypeWord,
)
from .parser import parse

_P = inspect.Parameter
_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
               "//": operator.floordiv, "%": operator.mod}
_TENSOR_HINT = {"+": "add(a, b)", "-": "sub(a, b)", "*": "mul(a, b) or scale(a, s)", "/": "div(a, b)"}


@dataclass
class Built:
    graph: Graph
    outputs: list[tuple[str, Tensor]]     # (name, tensor) in the order they were expanded
    tensors: dict[str, Tensor]            # every tensor the program named, and every input it used
    variables: dict[str, Any] = field(default_factory=dict)  # final value of every variable
    notes: list[str] = field(default_factory=list)           # things worth telling the user


def build(program: Program | str, ctx: Context, env: Env | None = None, outputs=None,
          graph_size: int | None = None, max_steps: int = MAX_STEPS) -> Built:
    """Create the program's tensors in ctx and a graph holding its outputs.

    outputs: names (variables, tensor names such as `x-3` from loops, or inputs); None means the
    last statement executed. graph_size: None means GGML's default 2048, grown if the graph needs it.
    max_steps: how many statements and loop iterations the program may run (limits.MAX_STEPS).
    """
    if isinstance(program, str):
        program = parse(program)
    ev = Evaluator(program, ctx, env if env is not None else DictEnv(), max_steps)
    ev.run()
    outs = ev.resolve_outputs(outputs)
    size, notes = _graph_size([("store", t) for t in ev.stores] + outs, graph_size)
    graph = Graph(ctx, size)
    for t in ev.stores:   # state writes first, as llama.cpp expands its KV-cache copies
        graph.expand(t)
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


def read_source(path: str) -> str:
    """An included file's text: a regular `.gg` file of at most MAX_SOURCE_BYTES, UTF-8 without
    NUL bytes. Raises OSError or ValueError with a reason that never quotes the file's bytes;
    a FIFO or a device is refused without being read (opened non-blocking, then checked)."""
    if not path.endswith(INCLUDE_SUFFIX):
        raise ValueError(f"not a {INCLUDE_SUFFIX} file (include reads programs only)")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        raise ValueError(f"larger than {MAX_SOURCE_BYTES} bytes")
    nul = data.find(b"\0")
    if nul >= 0:
        raise ValueError(f"not a text file (a NUL byte at offset {nul})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None


class _Return(Exception):
    def __init__(self, value):
        self.value = value


@dataclass
class _UserFunction:
    node: Def
    program: Program          # where it is defined (for error reports)
    defaults: dict            # parameter name -> default value (evaluated at the def)

    def signature(self) -> str:
        params = ", ".join(p.name if p.default is None else f"{p.name}=..." for p in self.node.params)
        return f"def {self.node.name}({params})"


@dataclass
class _Frame:
    kind: str                 # "call" or "include"
    name: str                 # function name or included file
    where: str                # the call or include site, for messages: "llama.gg line 58"
    loops_base: int           # len(evaluator.loops) when the frame began
    scope: dict | None = None  # a call's variables


class Evaluator:
    def __init__(self, program: Program, ctx: Context, env: Env, max_steps: int = MAX_STEPS):
        self.program, self.ctx, self.env = program, ctx, env
        self.max_steps, self.steps = max_steps, 0   # statements run and loop iterations, so far
        self.depth = 0                              # blocks and expressions in progress (limits.MAX_RUN_DEPTH)
        self.meta_values: dict[str, Any] = {}       # metadata read, converted once (a vocabulary is big)
        self.vars: dict[str, Any] = {}        # global variables
        self.inputs: dict[str, Tensor] = {}   # input tensors used, by name
        self.named: dict[str, Tensor] = {}    # tensors named by assignments, by their GGML name
        self.stores: list[Tensor] = []        # store(...) nodes: in the graph whatever the outputs
        self.loops: list[tuple[str, int]] = []
        self.frames: list[_Frame] = []
        self.functions: dict[str, _UserFunction] = {}
        self.included: set[str] = set()
        self.last: tuple[str, Any, Any] | None = None  # (output name, value, statement)

    @property
    def scope(self) -> dict:
        """The variables assignments write: the innermost call's, else the globals."""
        for f in reversed(self.frames):
            if f.scope is not None:
                return f.scope
        return self.vars

    def error(self, msg: str, node, cls: type[DSLError] = DSLError, **fields) -> DSLError:
        """`cls` at `node`'s position, in its loops and calls; `fields` (hint, kind, details) as DSLError takes them."""
        line, col = getattr(node, "pos", (0, 0)) or (0, 0)
        loop, context, hi = None, [], len(self.loops)
        for f in reversed(self.frames):
            inner = self.loops[f.loops_base:hi]
            if inner:
                text = ", ".join(f"{v}={i}" for v, i in inner)
                if loop is None and not context:
                    loop = text
                else:
                    context.append(f"in loop iteration {text}")
            context.append(f"in {f.name}() called at {f.where}" if f.kind == "call" else f"included from {f.where}")
            hi = f.loops_base
        outer = self.loops[:hi]
        if outer:
            text = ", ".join(f"{v}={i}" for v, i in outer)
            if loop is None and not context:
                loop = text
            else:
                context.append(f"in loop iteration {text}")
        if not line:
            return cls(msg, loop=loop, filename=self.program.filename, context=context, **fields)
        return cls(msg, line, col, self.program.source, self.program.filename, loop, context, **fields)

    def site(self, node) -> str:
        """'llama.gg line 58' (or 'line 58') for the statement or call `node` of the current program."""
        line = (getattr(node, "pos", (0, 0)) or (0, 0))[0]
        name = self.program.filename
        return f"{name} line {line}" if name and not name.startswith("<") else f"line {line}"

    # -- statements -------------------------------------------------------------------------
    def run(self) -> None:
        self.block(self.program.body)

    def step(self, node) -> None:
        """Count one statement or loop iteration; past max_steps the program stops here."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise self.too_many_steps(node)

    def too_many_steps(self, node) -> DSLError:
        return self.error(f"the program ran more than {self.max_steps} steps, its limit (statements run and "
                          "loop iterations): a loop without end?", node, StepLimitError)

    def enter(self, node) -> None:
        """One more block or expression in progress; past MAX_RUN_DEPTH an error, not Python's own
        RecursionError (eval does the same inline: it runs for every expression)."""
        self.depth += 1
        if self.depth > MAX_RUN_DEPTH:
            self.depth -= 1
            raise self.too_deep(node)

    def too_deep(self, node) -> DSLError:
        return self.error(f"the program nests more than {MAX_RUN_DEPTH} levels deep while it runs "
                          "(blocks and expressions, through function calls)", node)

    def block(self, body) -> None:
        if not body:
            return
        self.enter(body[0])
        try:
            for s in body:
                self.steps += 1   # self.step(s), inline: it runs for every statement
                if self.steps > self.max_steps:
                    raise self.too_many_steps(s)
                if isinstance(s, For):
                    self.loop(s)
                elif isinstance(s, Assign):
                    self.assign(s)
                elif isinstance(s, ExprStmt):
                    value = self.eval(s.value)
                    name = self.name_of(s.value) if isinstance(s.value, Name) else "result"
                    self.last = (name, value, s)
                elif isinstance(s, If):
                    self.if_block(s)
                elif isinstance(s, Def):
                    self.define(s)
                elif isinstance(s, Return):
                    raise _Return(self.eval(s.value))
                elif isinstance(s, Include):
                    self.include(s)
                else:
                    raise TypeError(f"not a statement: {s!r}")
        finally:
            self.depth -= 1

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
        self.scope[target] = value
        self.last = (target, value, s)

    def _new(self, t: Tensor, n0: int) -> bool:
        """Was t created by this statement (so naming it renames nothing else)?"""
        return (any(x is t for x in self.ctx.tensors[n0:])
                and not any(x is t for x in self.inputs.values()))

    def if_block(self, s: If) -> None:
        for cond, body in s.branches:
            if self.truth(self.eval(cond), cond, "if"):
                self.block(body)
                return
        self.block(s.orelse)

    def define(self, s: Def) -> None:
        name = s.name
        if name in FUNCTIONS or name in BUILTINS:
            what = "a GGML op" if name in FUNCTIONS else "a builtin"
            raise self.error(f"can't define '{name}': it is {what} (choose another name)", s)
        if name in self.functions:
            first = self.functions[name]
            raise self.error(f"function '{name}' is defined twice (first at {first.program.filename} line "
                             f"{first.node.pos[0]})", s)
        defaults = {p.name: self.eval(p.default) for p in s.params if p.default is not None}
        self.functions[name] = _UserFunction(s, self.program, defaults)

    def include(self, s: Include) -> None:
        rel = self.eval(s.path)
        base = self.program.filename
        base_dir = "" if not base or base.startswith("<") else os.path.dirname(base)
        path = rel if os.path.isabs(rel) else os.path.join(base_dir, rel)
        key = os.path.realpath(path)
        if key in self.included:
            return                                   # each file runs once (so cycles end)
        if sum(f.kind == "include" for f in self.frames) >= MAX_INCLUDE_DEPTH:
            raise self.error(f"include: files include each other more than {MAX_INCLUDE_DEPTH} deep", s.path)
        try:
            source = read_source(path)
        except (OSError, ValueError) as e:
            reason = getattr(e, "strerror", None) or str(e)
            raise self.error(f"include: can't read {shown(path, 1024)}: {reason}", s.path) from None
        self.included.add(key)
        name = os.path.normpath(path)
        try:
            program = parse(source, filename=name)
        except DSLError as e:   # where it was included from, as for errors when it runs
            raise DSLError(e.message, e.line, e.column, source, name, None, [f"included from {self.site(s)}"]) from None
        saved = self.program
        self.frames.append(_Frame("include", program.filename, self.site(s), len(self.loops)))
        self.program = program
        try:
            self.block(program.body)
        finally:
            self.program = saved
            self.frames.pop()

    def loop(self, s: For) -> None:
        args = [self.eval(a) for a in s.range_args]
        for a, node in zip(args, s.range_args):
            if not is_number(a) or isinstance(a, float):
                raise self.error(f"range() needs integers, got {describe(a)}", node)
        if len(args) == 3 and args[2] == 0:
            raise self.error("range() step must not be zero", s.range_args[2])
        for i in range(*args):
            self.scope[s.var] = i
            self.loops.append((s.var, i))
            try:
                self.step(s)
                self.block(s.body)
            finally:
                self.loops.pop()

    # -- expressions ------------------------------------------------------------------------
    def eval(self, e):
        if isinstance(e, Num):
            return e.value
        self.depth += 1
        if self.depth > MAX_RUN_DEPTH:
            self.depth -= 1
            raise self.too_deep(e)
        try:
            if isinstance(e, Name):
                return self.lookup(e)
            if isinstance(e, Call):
                return self.call(e)
            if isinstance(e, BinOp):
                return self.binop(e)
            if isinstance(e, Str):
                return self.joined(e)
            if isinstance(e, TypeWord):
                try:
                    return T.parse_type(e.name)
                except GGToolError as exc:
                    raise self.error(str(exc), e) from None
            if isinstance(e, Null):
                return None
            if isinstance(e, Compare):
                return self.compare(e)
            if isinstance(e, BoolOp):
                a = self.truth(self.eval(e.left), e.left, e.op)
                if a == (e.op == "or"):        # short circuit: 'x or ...' with x true, 'x and ...' with x false
                    return int(a)
                return int(self.truth(self.eval(e.right), e.right, e.op))
            if isinstance(e, Not):
                return int(not self.truth(self.eval(e.operand), e.operand, "not"))
            if isinstance(e, Index):
                return self.index(e)
            if isinstance(e, Neg):
                v = self.eval(e.operand)
                if not is_number(v):
                    hint = "; for a tensor use neg(x) or scale(x, -1)" if isinstance(v, Tensor) else ""
                    raise self.error(f"unary '-' needs a number, got {describe(v)}{hint}", e.operand)
                if int_out_of_range(-v):
                    raise self.error(f"-({v}) is out of range ({INT64_RANGE})", e)
                return -v
            raise TypeError(f"not an expression: {e!r}")
        finally:
            self.depth -= 1

    def name_of(self, n: Name) -> str:
        parts = n.parts
        if len(parts) == 1 and type(parts[0]) is str:   # n.plain, without a property call: names are many
            return parts[0]
        return self.joined(n)

    def joined(self, e: Name | Str) -> str:
        """A name or string with its {...} filled in; at most MAX_STRING characters."""
        self.enter(e)   # a level of its own: {...} costs more Python frames than other nesting
        try:
            text = "".join([p if isinstance(p, str) else self.interp(p) for p in e.parts])
        finally:
            self.depth -= 1
        if len(text) > MAX_STRING:
            what = "name" if isinstance(e, Name) else "string"
            raise self.error(f"this {what} would be {len(text)} characters long; at most {MAX_STRING} "
                             "may be built with {...}", e)
        return text

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
        scope = self.scope
        if name in scope:
            return scope[name]
        if name in self.vars:
            return self.vars[name]
        t = self.input(name, n)
        if t is not None:
            return t
        kind = "tensor" if ("." in name or n.plain is None) else "tensor or variable"
        known = [*scope, *self.vars, *self.env.names()]
        raise self.error(f"unknown {kind} {shown(name, 100)}{suggest(name, known)}", n)

    def truth(self, v, node, what: str) -> bool:
        """A condition: a number, true unless 0 (comparisons give 1 or 0)."""
        if not is_number(v):
            hint = "; compare it with something (==, <, ...)" if not isinstance(v, Tensor) else \
                "; a tensor's values are only known when the graph is computed"
            raise self.error(f"'{what}' needs a number (0 is false, anything else true), got {describe(v)}{hint}",
                             node)
        return v != 0

    def compare(self, e: Compare) -> int:
        a, b = self.eval(e.left), self.eval(e.right)
        for v, side in ((a, e.left), (b, e.right)):
            if isinstance(v, Tensor):
                raise self.error(f"'{e.op}' can't compare {describe(v)}: a tensor's values are only known when "
                                 "the graph is computed (compare its sizes: ne(t, 0) == 4)", side)
        if e.op in ("==", "!="):
            same = (is_number(a) and is_number(b)) or (type(a) is type(b)) \
                or (isinstance(a, T.GGMLType) and isinstance(b, T.GGMLType))
            if not same:
                raise self.error(f"'{e.op}' can't compare {describe(a)} with {describe(b)}", e)
            equal = a == b
            return int(equal if e.op == "==" else not equal)
        for v, side in ((a, e.left), (b, e.right)):
            if not is_number(v):
                raise self.error(f"'{e.op}' needs numbers, got {describe(v)}", side)
        return int({"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[e.op])

    def index(self, e: Index):
        v, i = self.eval(e.value), self.eval(e.index)
        if not isinstance(v, tuple):
            raise self.error(f"can't index {describe(v)}: only arrays (metadata arrays) have elements", e.value)
        if not is_number(i) or isinstance(i, float):
            raise self.error(f"an index must be an integer, got {describe(i)}", e.index)
        if not -len(v) <= i < len(v):
            raise self.error(f"index {i} is out of range: the array has {len(v)} values", e.index)
        return v[i]

    def input(self, name: str, node=None) -> Tensor | None:
        if name in self.inputs:
            return self.inputs[name]
        try:
            t = self.env.tensor(name, self.ctx)
        except DSLError:
            raise
        except GGToolError as exc:   # an InputError located at this input says so itself
            prefix = "" if getattr(exc, "input", None) == name else f"input '{name}': "
            raise self.error(f"{prefix}{exc}", node) from exc
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
        try:
            r = _ARITHMETIC[e.op](a, b)
        except OverflowError:
            r = float("inf")
        if int_out_of_range(r):
            raise self.error(f"{a} {e.op} {b} is out of range ({INT64_RANGE})", e)
        if overflowed(r, a, b):
            raise self.error(f"{a!r} {e.op} {b!r} overflows a float (it would be {r!r})", e)
        return r

    # -- calls ------------------------------------------------------------------------------
    def call(self, c: Call):
        u = self.functions.get(c.func)
        b, f = BUILTINS.get(c.func), FUNCTIONS.get(c.func)
        if u is None and b is None and f is None:
            known = [*self.functions, *FUNCTIONS, *BUILTINS]
            raise self.error(f"unknown op {shown(c.func, 100)}{suggest(c.func, known)}", c)
        args = [self.eval(a) for a in c.args]
        kwargs = {k.name: self.eval(k.value) for k in c.kwargs}
        if u is not None:
            return self.call_user(u, c, args, kwargs)
        if b is not None and not (b.scalar_math and f is not None
                                  and any(isinstance(v, Tensor) for v in [*args, *kwargs.values()])):
            self.check_args(b.fn, b.signature, c, args, kwargs)
            try:
                return b.fn(self, *args, **kwargs)
            except BuiltinError as exc:
                at = c.args[exc.arg] if exc.arg is not None and exc.arg < len(c.args) else c
                raise self.error(str(exc), at, hint=exc.hint, kind=exc.kind, **exc.details) from None
            except DSLError:
                raise
            except GGToolError as exc:
                raise self.error(str(exc), c) from exc
        self.check_args(f.build, f.signature, c, args, kwargs)
        for i, v in enumerate(args):
            if type(v) is int and not INT64_MIN <= v <= INT64_MAX:   # e.g. a uint64 metadata value
                raise self.error(f"{c.func}(): {v} is out of range ({INT64_RANGE})", c.args[i])
        for k in c.kwargs:
            if int_out_of_range(kwargs[k.name]):
                raise self.error(f"{c.func}(): {kwargs[k.name]} is out of range ({INT64_RANGE})", k)
        try:
            t = f(self.ctx, *args, **kwargs)
        except DSLError:
            raise
        except GGToolError as exc:  # ShapeError etc.: the op's own message, at the call
            raise self.error(str(exc), c) from exc
        except Exception as exc:  # a builder tripping over a value of the wrong kind
            got = ", ".join([describe(v) for v in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()])
            # a value of the wrong kind trips the builder over an attribute or an operator: the
            # arguments and the signature say what is wrong; the builder's own words would not
            why = "" if isinstance(exc, (AttributeError, TypeError)) else f": {type(exc).__name__}: {exc}"
            raise self.error(f"{c.func}() can't use these arguments ({got}){why}; expected {f.signature}", c) from exc
        if not isinstance(t, Tensor):
            raise self.error(f"op {c.func} returned {describe(t)}, not a tensor", c)
        return t

    def call_user(self, u: _UserFunction, c: Call, args: list, kwargs: dict):
        """Bind the arguments as Python does, run the body in a new scope; its `return` value."""
        params = u.node.params
        names = [p.name for p in params]
        where = f"{u.signature()} ({u.program.filename} line {u.node.pos[0]})" \
            if not u.program.filename.startswith("<") else f"{u.signature()} (line {u.node.pos[0]})"
        if len(args) > len(params):
            s = "" if len(params) == 1 else "s"
            raise self.error(f"{c.func}() takes {len(params)} argument{s}, got {len(args)}: {where}", c)
        scope = dict(zip(names, args))
        for k in c.kwargs:
            if k.name not in names:
                raise self.error(f"{c.func}() has no parameter '{k.name}'{suggest(k.name, names)}: {where}", k)
            if k.name in scope:
                raise self.error(f"{c.func}() got argument '{k.name}' twice (by position and by keyword)", k)
            scope[k.name] = kwargs[k.name]
        missing = [n for n in names if n not in scope and n not in u.defaults]
        if missing:
            s = "" if len(missing) == 1 else "s"
            raise self.error(f"{c.func}() is missing argument{s} {', '.join(repr(m) for m in missing)}: {where}", c)
        for n in names:
            if n not in scope:
                scope[n] = u.defaults[n]
        if sum(f.kind == "call" for f in self.frames) >= MAX_CALL_DEPTH:
            raise self.error(f"{c.func}(): calls nest more than {MAX_CALL_DEPTH} deep (a function that calls "
                             "itself without end?)", c)
        saved = self.program
        self.frames.append(_Frame("call", c.func, self.site(c), len(self.loops), scope))
        self.program = u.program
        try:
            self.block(u.node.body)
            value = None
        except _Return as r:
            value = r.value
        finally:
            self.program = saved
            self.frames.pop()
        return value

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
                raise UnknownOutputError(f"unknown output '{name}'"
                                         f"{suggest(name, [*known, *self.named, *self.env.names()])}", name)
            outs.append((name, value))
        return outs
