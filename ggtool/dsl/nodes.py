"""The AST. Nodes compare by content only (positions are ignored), so a round trip through the
printer can be checked with `==`.

Nodes are frozen value classes with slots, made by `node` rather than `dataclasses` (which costs
~0.5 ms a class: 11 ms of every DSL command's start for these 22): a generated `__init__`,
`__eq__`, `__hash__`, `__repr__` and `__reduce__` (pickle, copy) each, over the annotated fields
in order. A field whose default is `Hidden(...)` is left out of comparison, hash and repr
(positions, the program's text)."""

from __future__ import annotations

Pos = tuple  # (line, column), both 1-based


class FrozenNodeError(AttributeError):
    """An AST node is immutable."""


class Hidden:
    """The default of a field left out of `==`, hash and repr."""

    __slots__ = ("default",)

    def __init__(self, default):
        self.default = default


def _frozen(self, name, value):
    raise FrozenNodeError(f"cannot assign to field {name!r}: {type(self).__name__} nodes are immutable")


def node(cls):
    """Make cls a frozen value class over its annotated fields (see the module docstring); a
    `derived` tuple names fields computed by `_derive(self)` instead of passed in."""
    names = [n for n in cls.__dict__.get("__annotations__", {})]
    derived = cls.__dict__.get("derived", ())
    defaults = {n: cls.__dict__[n] for n in names if n in cls.__dict__}
    shown = [n for n in names if not isinstance(defaults.get(n), Hidden)]
    args, ns = [], {"_set": object.__setattr__}
    for n in names:
        if n in derived:
            continue
        if n in defaults:
            d = defaults[n]
            ns[f"_d_{n}"] = d.default if isinstance(d, Hidden) else d
            args.append(f"{n}=_d_{n}")
        else:
            args.append(n)
    body = [f"_set(self, {n!r}, {n})" for n in names if n not in derived]
    if derived:
        body.append("self._derive()")
    key = "(" + "".join(f"self.{n}, " for n in shown) + ")"
    okey = key.replace("self.", "other.")
    fields = ", ".join(f"{n}={{self.{n}!r}}" for n in shown if n not in derived)
    src = (f"def __init__(self, {', '.join(args)}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
           f"def __eq__(self, other):\n    if other.__class__ is not self.__class__:\n        return NotImplemented\n"
           f"    return {key} == {okey}\n"
           f"def __hash__(self):\n    return hash({key})\n"
           f"def __repr__(self):\n    return f\"{cls.__name__}({fields})\"\n"
           f"def __reduce__(self):\n    return (self.__class__, ({''.join(f'self.{n}, ' for n in names if n not in derived)}))\n")
    exec(src, ns)
    attrs = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    attrs.update(__slots__=tuple(names), __setattr__=_frozen, __delattr__=_frozen,
                 **{k: ns[k] for k in ("__init__", "__eq__", "__hash__", "__repr__", "__reduce__")})
    return type(cls.__name__, cls.__bases__, attrs)


@node
class Num:
    value: int | float
    pos: Pos = Hidden((0, 0))
    is_float: bool  # so that Num(1) != Num(1.0)
    derived = ("is_float",)

    def _derive(self):
        object.__setattr__(self, "is_float", isinstance(self.value, float))


@node
class Str:
    parts: tuple  # str pieces and interpolated expressions: "{arch}.block_count"
    pos: Pos = Hidden((0, 0))


@node
class Name:
    parts: tuple  # str pieces and interpolated expressions: blk.{i}.attn_q.weight
    pos: Pos = Hidden((0, 0))

    @property
    def plain(self) -> str | None:
        """The name if it has no interpolation."""
        if len(self.parts) == 1 and isinstance(self.parts[0], str):
            return self.parts[0]
        return None


@node
class TypeWord:
    name: str  # f32, f16, i32, q4_0, q8_0, ... as written
    pos: Pos = Hidden((0, 0))


@node
class Null:
    pos: Pos = Hidden((0, 0))


@node
class Neg:
    operand: Expr
    pos: Pos = Hidden((0, 0))


@node
class BinOp:
    op: str  # + - * / // %
    left: Expr
    right: Expr
    pos: Pos = Hidden((0, 0))  # the operator


@node
class Keyword:
    name: str
    value: Expr
    pos: Pos = Hidden((0, 0))


@node
class Call:
    func: str
    args: tuple = ()
    kwargs: tuple = ()  # Keyword nodes, in source order
    pos: Pos = Hidden((0, 0))


@node
class Compare:
    op: str  # == != < <= > >=
    left: Expr
    right: Expr
    pos: Pos = Hidden((0, 0))  # the operator


@node
class BoolOp:
    op: str  # and, or
    left: Expr
    right: Expr
    pos: Pos = Hidden((0, 0))  # the operator


@node
class Not:
    operand: Expr
    pos: Pos = Hidden((0, 0))


@node
class Index:
    value: Expr   # an array (a metadata array)
    index: Expr
    pos: Pos = Hidden((0, 0))  # the '['


Expr = Num | Str | Name | TypeWord | Null | Neg | BinOp | Compare | BoolOp | Not | Index | Call


@node
class Assign:
    target: Name
    value: Expr
    pos: Pos = Hidden((0, 0))


@node
class ExprStmt:
    value: Expr
    pos: Pos = Hidden((0, 0))


@node
class For:
    var: str
    range_args: tuple  # 1 to 3 expressions, as Python's range()
    body: tuple
    pos: Pos = Hidden((0, 0))


@node
class If:
    branches: tuple  # ((condition, body), ...): the if, then each elif, in order
    orelse: tuple = ()  # the else body
    pos: Pos = Hidden((0, 0))


@node
class Param:
    name: str
    default: Expr | None = None
    pos: Pos = Hidden((0, 0))


@node
class Def:
    name: str
    params: tuple  # Param nodes
    body: tuple
    pos: Pos = Hidden((0, 0))


@node
class Return:
    value: Expr
    pos: Pos = Hidden((0, 0))


@node
class Include:
    path: Str
    pos: Pos = Hidden((0, 0))


Stmt = Assign | ExprStmt | For | If | Def | Return | Include


@node
class Program:
    body: tuple
    source: str = Hidden("")
    filename: str = Hidden("<program>")
