"""DSL functions that are not GGML ops: metadata, tensor dimensions, scalar math, arange_i32,
causal_mask, and the value helpers len and kind.

Scalar math (sqrt, exp, log, abs) shares names with GGML's element-wise ops: given numbers it
computes a number, given a tensor it calls the op (`sqrt(head_dim)` vs `sqrt(x)`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import types as T
from ..errors import GGToolError
from ..tensor import Tensor
from .limits import INT64_RANGE, int_out_of_range, shown

_MISSING = object()


class BuiltinError(Exception):
    """A bad argument to a builtin; `arg` is the index of the culprit, if one is to blame. `hint`,
    `kind` and `details` go on to the DSLError (see there)."""

    def __init__(self, message: str, arg: int | None = None, *, hint: str = "", kind: str | None = None, **details):
        super().__init__(message)
        self.arg, self.hint, self.kind, self.details = arg, hint, kind, details


@dataclass
class Builtin:
    name: str
    signature: str
    doc: str
    fn: Callable               # (evaluator, *args) -> value
    scalar_math: bool = False  # with a tensor argument, the GGML op of the same name is called

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(list(inspect.signature(self.fn).parameters)[1:])


BUILTINS: dict[str, Builtin] = {}


def builtin(signature: str, doc: str, scalar_math: bool = False):
    def deco(fn):
        name = signature.split("(")[0]
        BUILTINS[name] = Builtin(name, signature, doc, fn, scalar_math)
        return fn
    return deco


def describe(v) -> str:
    """A value as error messages show it."""
    if isinstance(v, tuple):
        kinds = {kind_of(x) for x in v}
        what = f"{kinds.pop()}s" if len(kinds) == 1 else "values"
        return f"array of {len(v)} {what}"
    if isinstance(v, Tensor):
        ne = ", ".join(str(n) for n in v.ne)
        return f"tensor '{v.name}' ({T.type_name(v.type)} [{ne}])"
    if isinstance(v, T.GGMLType):
        return f"type {T.type_name(v)}"
    if v is None:
        return "null"
    if isinstance(v, str):
        return f"string {shown(v)}"
    return f"{type(v).__name__} {v!r}"


def kind_of(v) -> str:
    """What a value is: tensor, int, float, string, type, null or array."""
    if isinstance(v, Tensor):
        return "tensor"
    if isinstance(v, T.GGMLType):
        return "type"
    if v is None:
        return "null"
    if isinstance(v, str):
        return "string"
    if isinstance(v, tuple):
        return "array"
    return type(v).__name__


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, (bool, T.GGMLType))


def _number(v, i: int, fname: str, what: str = "a number"):
    if not is_number(v):
        raise BuiltinError(f"{fname}() needs {what}, got {describe(v)}", i)
    return v


def _integer(v, i: int, fname: str):
    if not is_number(v) or isinstance(v, float):
        raise BuiltinError(f"{fname}() needs an integer, got {describe(v)}", i)
    return v


def _tensor(v, i: int, fname: str) -> Tensor:
    if not isinstance(v, Tensor):
        raise BuiltinError(f"{fname}() needs a tensor, got {describe(v)}", i)
    return v


def _dim(v, i: int, fname: str) -> int:
    _integer(v, i, fname)
    if not 0 <= v < 4:
        raise BuiltinError(f"{fname}(): dimension must be 0, 1, 2 or 3, got {v}", i)
    return v


def _type(v, i: int, fname: str) -> T.GGMLType:
    if isinstance(v, T.GGMLType):
        return v
    if isinstance(v, str):
        try:
            return T.parse_type(v)
        except GGToolError as e:
            raise BuiltinError(str(e), i) from None
    raise BuiltinError(f"{fname}() needs a type (f32, f16, i32, q4_0, q8_0, ...), got {describe(v)}", i)


def meta_value(v, key: str):
    """A metadata value as a DSL value: numpy scalars become int/float, bytes str, bools 0/1, and
    arrays (lists) tuples of those (the DSL's arrays, indexed with a[i])."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v.item()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bytes):
        v = v.decode("utf-8", errors="replace")
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(meta_value(x, key) for x in v)
    if not isinstance(v, (int, float, str)):
        raise BuiltinError(f"metadata '{key}' has an unsupported value {v!r}", 0)
    return v


# -- metadata and tensor properties -----------------------------------------------------------
@builtin("meta(key, default)", "a GGUF metadata value (a number, a string or an array of them); `default` "
         "(optional) if the key is absent")
def _meta(ev, key, default=_MISSING):
    if not isinstance(key, str):
        raise BuiltinError(f"meta() needs a string key, got {describe(key)}", 0)
    if key in ev.meta_values:
        return ev.meta_values[key]
    try:
        v = ev.env.metadata(key)
    except KeyError:
        if default is _MISSING:
            raise BuiltinError(f"no metadata {shown(key)} (give a default: meta(\"{key}\", value))", 0) from None
        return default
    v = ev.meta_values[key] = meta_value(v, key)
    return v


@builtin("architecture(name, ...)", "declares the model architectures the program computes (GGUF "
         "general.architecture, e.g. \"llama\"); a model of another one is an error naming both")
def _architecture(ev, *names):
    if not names:
        raise BuiltinError('architecture() needs the name of at least one architecture, e.g. architecture("llama")')
    for i, n in enumerate(names):
        if not isinstance(n, str):
            raise BuiltinError(f"architecture() needs names as strings, got {describe(n)}", i)
    try:
        arch = meta_value(ev.env.metadata("general.architecture"), "general.architecture")
    except KeyError:
        return None   # no model to check (no GGUF metadata)
    if arch not in names:
        want = " or ".join(shown(n) for n in names)
        raise BuiltinError(f"this program computes the {want} architecture, but the model's general.architecture "
                           f"is {shown(str(arch))}")
    return None


@builtin("ne(t, i)", "t->ne[i]: the size of dimension i (GGML order, 0 innermost)")
def _ne(ev, t, i):
    return _tensor(t, 0, "ne").ne[_dim(i, 1, "ne")]


@builtin("nb(t, i)", "t->nb[i]: the byte stride of dimension i")
def _nb(ev, t, i):
    return _tensor(t, 0, "nb").nb[_dim(i, 1, "nb")]


@builtin("nelements(t)", "ggml_nelements: ne0*ne1*ne2*ne3")
def _nelements(ev, t):
    return _tensor(t, 0, "nelements").nelements


@builtin("nrows(t)", "ggml_nrows: ne1*ne2*ne3")
def _nrows(ev, t):
    return _tensor(t, 0, "nrows").nrows


@builtin("n_dims(t)", "ggml_n_dims: 1 + the last dimension > 1")
def _n_dims(ev, t):
    return _tensor(t, 0, "n_dims").n_dims


@builtin("element_size(t)", "ggml_element_size: bytes per element (per block for quantized types)")
def _element_size(ev, t):
    return T.type_size(_tensor(t, 0, "element_size").type)


@builtin("row_size(type, n)", "ggml_row_size: bytes of n elements of `type` (a type word or a tensor's type)")
def _row_size(ev, type, n):
    ty = type.type if isinstance(type, Tensor) else _type(type, 0, "row_size")
    n = _integer(n, 1, "row_size")
    if n % T.block_size(ty):
        raise BuiltinError(f"row_size(): {n} is not a multiple of {T.type_name(ty)}'s block size "
                           f"{T.block_size(ty)}", 1)
    return T.row_size(ty, n)


@builtin("has_tensor(name)", "1 if an input tensor `name` exists (a named input, or a tensor of a GGUF file), else 0")
def _has_tensor(ev, name):
    if not isinstance(name, str):
        raise BuiltinError(f"has_tensor() needs the tensor's name as a string, got {describe(name)}", 0)
    return int(name in ev.inputs or name in ev.env.names())


@builtin("type(t)", "t->type, e.g. to create a tensor of the same type")
def _type_of(ev, t):
    return _tensor(t, 0, "type").type


def _name_arg(name, fn: str) -> None:
    """input() and state() name what they declare first, as a string."""
    if not isinstance(name, str):
        raise BuiltinError(f"{fn}() needs the {fn}'s name as a string, got {describe(name)}", 0)


@builtin("input(name, type, ne0, ne1, ne2, ne3)",
         "declares the program's input `name` of `type`; where no data is read (inspect-graph, plan) "
         "and none is given, a placeholder of shape [ne0, ...] stands in")
def _input(ev, name, type, *ne):
    _name_arg(name, "input")
    ty = _type(type, 1, "input")
    t = ev.input(name)
    if t is not None:
        if t.type != ty:
            want = T.type_name(ty)
            raise BuiltinError(f"input '{name}' is {T.type_name(t.type)}, the program needs {want}", 0,
                               hint=f" (e.g. {name}={want}:...)", kind="input-type", name=name, type=want)
        return t
    if getattr(ev.env, "read_data", True):
        raise BuiltinError(f"no input '{name}' was given", 0, kind="missing-input", name=name)
    if not 1 <= len(ne) <= 4:
        raise BuiltinError(f"no input '{name}' was given and input() has no placeholder shape", 0,
                           kind="missing-placeholder", name=name)
    dims = [_integer(n, i + 2, "input") for i, n in enumerate(ne)]
    placeholder = ev.ctx.new_tensor(ty, dims)
    placeholder.name = name
    ev.inputs[name] = placeholder  # an input: the assignment that declares it does not rename it
    return placeholder


@builtin("arange_i32(start, stop, step)",
         "an I32 leaf holding range(start, stop, step) (one argument: 0..stop-1), e.g. token positions")
def _arange_i32(ev, *args):
    if not 1 <= len(args) <= 3:
        raise BuiltinError(f"arange_i32() takes 1 to 3 arguments (stop | start, stop[, step]), got {len(args)}")
    for i, a in enumerate(args):
        _integer(a, i, "arange_i32")
    if len(args) == 3 and args[2] == 0:
        raise BuiltinError("arange_i32(): step must not be zero", 2)
    r = range(*args)
    if not r:
        raise BuiltinError(f"arange_i32{tuple(args)} is empty")
    if min(r[0], r[-1]) < -2**31 or max(r[0], r[-1]) >= 2**31:
        raise BuiltinError("arange_i32(): values do not fit in int32")
    t = ev.ctx.new_tensor(T.I32, [len(r)])
    if t.has_data:   # a measuring context (plan, inspect-graph) lays the tensor out, no values
        t.set_data(np.arange(r.start, r.stop, r.step, dtype=np.int32))
    return t


@builtin("causal_mask(n_tokens, n_swa, n_kv)",
         "an F32 leaf [n_kv, n_tokens] (n_kv defaults to n_tokens): llama.cpp's KQ mask for one batch at positions "
         "0..n_tokens-1, 0 where query i may see key j (j <= i, and i - j < n_swa if n_swa > 0), -inf elsewhere")
def _causal_mask(ev, n_tokens, n_swa=0, n_kv=None):
    n_tokens = _integer(n_tokens, 0, "causal_mask")
    n_swa = _integer(n_swa, 1, "causal_mask")
    n_kv = n_tokens if n_kv is None else _integer(n_kv, 2, "causal_mask")
    if n_tokens < 1:
        raise BuiltinError(f"causal_mask(): n_tokens must be at least 1, got {n_tokens}", 0)
    if n_swa < 0:
        raise BuiltinError(f"causal_mask(): n_swa must be 0 (no window) or positive, got {n_swa}", 1)
    if n_kv < n_tokens:
        raise BuiltinError(f"causal_mask(): n_kv ({n_kv}) must be at least n_tokens ({n_tokens})", 2)
    t = ev.ctx.new_tensor(T.F32, [n_kv, n_tokens])
    if t.has_data:   # a measuring context (plan, inspect-graph) lays the tensor out, no values
        fill_causal_mask(t.data.reshape(n_tokens, n_kv), np.arange(n_tokens), n_swa)
    return t


_FEW_ROWS = 8


def fill_causal_mask(rows: np.ndarray, positions: np.ndarray, n_swa: int = 0) -> None:
    """rows[i, j] (numpy (n_tokens, n_kv)) = 0 where the query at positions[i] may see the key in
    cache cell j (j <= pos, and pos - j < n_swa if n_swa > 0), else -inf: llama.cpp's KQ mask for
    a batch whose cells are the positions 0..n_kv-1 (what ggtool.generate's cache holds)."""
    if len(positions) <= _FEW_ROWS:             # a decode step's row: two slices, no temporaries
        for row, pos in zip(rows, positions):
            pos = int(pos)
            row[:] = np.float32(-np.inf)
            row[max(0, pos - n_swa + 1) if n_swa > 0 else 0:max(0, pos + 1)] = np.float32(0)
        return
    j = np.arange(rows.shape[1])[None, :]       # key (column: ne0)
    for i0 in range(0, len(positions), 256):   # a block of query rows (ne1) at a time: no n² temporaries
        i = np.asarray(positions[i0:i0 + 256])[:, None]
        visible = j <= i
        if n_swa > 0:
            visible &= i - j < n_swa
        rows[i0:i0 + len(i)] = np.where(visible, np.float32(0), np.float32(-np.inf))


# -- persistent state (a KV cache) -----------------------------------------------------------------
@builtin("state(name, type, ne0, ne1, ne2, ne3)",
         "a tensor that outlives one compute (a KV cache): the environment's own if it keeps state "
         "(ggtool.generate does), else the input `name` if one is given, else zeros of [ne0, ...]")
def _state(ev, name, type, *ne):
    _name_arg(name, "state")
    ty = _type(type, 1, "state")
    if not 1 <= len(ne) <= 4:
        raise BuiltinError(f"state() takes 1 to 4 sizes after the type, got {len(ne)}")
    dims = [_integer(n, i + 2, "state") for i, n in enumerate(ne)]
    if any(n < 1 for n in dims):
        raise BuiltinError(f"state(): sizes must be positive, got {dims}")
    keeper = getattr(ev.env, "state", None)
    t = keeper(name, ty, dims, ev.ctx) if keeper is not None else ev.input(name)
    if t is None:
        t = ev.ctx.new_tensor(ty, dims)   # zeros: the pool is zero-filled
        t.name = name
    elif t.type != ty or list(t.ne[:len(dims)]) != dims or any(n != 1 for n in t.ne[len(dims):]):
        raise BuiltinError(f"state '{name}' is {T.type_name(t.type)}{list(t.ne[:len(dims)])}, the program needs "
                           f"{T.type_name(ty)}{dims}", 0, kind="state-shape", name=name)
    ev.inputs[name] = t   # an output by its name: it holds what store() wrote, after the compute
    return t


@builtin("store(state, value)",
         "ggml_cpy(value, state), kept in the graph whatever the outputs are (expanded before them): "
         "the compute leaves `value` in the state for the next one")
def _store(ev, state, value):
    dst, src = _tensor(state, 0, "store"), _tensor(value, 1, "store")
    if not any(dst is t for t in ev.inputs.values()):
        raise BuiltinError("store() writes into a state(...) tensor (or an input)", 0)
    from ..ops.base import FUNCTIONS

    node = FUNCTIONS["cpy"](ev.ctx, src, dst)
    ev.stores.append(node)
    return node


# -- values -----------------------------------------------------------------------------------
@builtin("len(x)", "the number of values of an array (or characters of a string)")
def _len(ev, x):
    if not isinstance(x, (tuple, str)):
        raise BuiltinError(f"len() needs an array or a string, got {describe(x)}", 0)
    return len(x)


@builtin("kind(x)", "what a value is, as a string: \"tensor\", \"int\", \"float\", \"string\", \"type\", "
         "\"null\" or \"array\"")
def _kind(ev, x):
    return kind_of(x)


# -- scalar math ------------------------------------------------------------------------------
def _math(name: str, f: Callable, doc: str):
    def fn(ev, x):
        x = _number(x, 0, name)
        try:
            return f(x)
        except (ValueError, OverflowError) as e:
            raise BuiltinError(f"{name}({x!r}): {e}", 0) from None
    BUILTINS[name] = Builtin(name, f"{name}(x)", doc, fn, scalar_math=True)


_math("sqrt", math.sqrt, "square root of a number (of a tensor: GGML's sqrt op)")
_math("exp", math.exp, "e**x of a number (of a tensor: GGML's exp op)")
_math("log", math.log, "natural log of a number (of a tensor: GGML's log op)")
_math("abs", abs, "absolute value of a number (of a tensor: GGML's abs op)")


@builtin("int(x)", "a number truncated toward zero (or a numeric string parsed)", scalar_math=True)
def _int(ev, x):
    if isinstance(x, str):
        digits = x.strip().lstrip("+-").lstrip("0")
        if len(digits) > 19 and digits.isdigit():   # int() of thousands of digits is slow, or refused
            raise BuiltinError(f"int(): {shown(x)} is out of range ({INT64_RANGE})", 0)
        try:
            x = int(x.strip())
        except ValueError:
            raise BuiltinError(f"int(): {shown(x)} is not an integer", 0) from None
    x = _number(x, 0, "int")
    if isinstance(x, float) and not math.isfinite(x):
        raise BuiltinError(f"int(): cannot convert {x!r}", 0)
    if int_out_of_range(int(x)):
        raise BuiltinError(f"int(): {x!r} is out of range ({INT64_RANGE})", 0)
    return int(x)


@builtin("float(x)", "a number as a float", scalar_math=True)
def _float(ev, x):
    if isinstance(x, str):
        try:
            v = float(x.strip())
        except ValueError:
            raise BuiltinError(f"float(): {shown(x)} is not a number", 0) from None
        if math.isinf(v) and "inf" not in x.lower():
            raise BuiltinError(f"float(): {shown(x)} is too large for a float (it would be {v!r})", 0)
        return v
    return float(_number(x, 0, "float"))


@builtin("min(a, b, ...)", "the smallest of some numbers", scalar_math=True)
def _min(ev, *xs):
    if not xs:
        raise BuiltinError("min() needs at least one number")
    return min(_number(x, i, "min") for i, x in enumerate(xs))


@builtin("max(a, b, ...)", "the largest of some numbers", scalar_math=True)
def _max(ev, *xs):
    if not xs:
        raise BuiltinError("max() needs at least one number")
    return max(_number(x, i, "max") for i, x in enumerate(xs))
