"""The op registry. A family module declares, side by side, each op's builder (shape rule and
asserts), its n_tasks, its work size and its forward kernel:

    @kernel("ADD", n_tasks=ALL, work_size=lambda node, n_tasks: 0)
    def forward_add(node, ith, nth, work): ...          # writes rows of node.data

    @function("add", "ggml_add(ctx, a, b)", "a + b; b is tiled over a (modulo)")
    def add(ctx, a, b): ...                            # returns the new Tensor

Kernels take GGML's (ith, nth) and must touch only their own slice, so the worker pool can run
them unchanged in several processes. `work.wdata` is the plan's work buffer (uint8, shared) and
`work.barrier()` is the barrier for ops that need one inside (mul_mat after converting src1).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..context import Context
from ..errors import GGToolError, ShapeError
from ..tensor import UNARY_OPS, Tensor

ALL = -1  # n_tasks = n_threads

KERNELS: dict[str, Kernel] = {}
FUNCTIONS: dict[str, Function] = {}


@dataclass
class Kernel:
    op: str                                   # ggml_op_desc: "ADD", "MUL_MAT", "GELU", ...
    forward: Callable | None                  # (node, ith, nth, work) -> None; None for no-ops
    tasks: int | Callable = 1                 # ALL, a number, or (node, n_threads) -> int
    work: Callable | None = None              # (node, n_tasks) -> bytes

    def n_tasks(self, node: Tensor, n_threads: int) -> int:
        if callable(self.tasks):
            return self.tasks(node, n_threads)
        return n_threads if self.tasks == ALL else self.tasks

    def work_size(self, node: Tensor, n_tasks: int) -> int:
        return self.work(node, n_tasks) if self.work else 0


@dataclass
class Function:
    name: str             # the DSL name: GGML's function name without ggml_
    signature: str        # the C signature, for `ggtool ops`
    doc: str              # one line
    build: Callable       # (ctx, *args, **kwargs) -> Tensor
    params: tuple[str, ...]  # GGML's parameter names after ctx (keyword arguments)

    def __call__(self, ctx: Context, *args, **kwargs) -> Tensor:
        return self.build(ctx, *args, **kwargs)


def kernel(op: str, n_tasks: int | Callable = 1, work_size: Callable | None = None):
    def deco(fn):
        if op in KERNELS:
            raise RuntimeError(f"kernel {op} registered twice")
        KERNELS[op] = Kernel(op, fn, n_tasks, work_size)
        return fn
    return deco


def noop_kernel(op: str) -> None:
    KERNELS[op] = Kernel(op, None, 1, None)


def function(name: str, signature: str, doc: str):
    def deco(fn):
        if name in FUNCTIONS:
            raise RuntimeError(f"function {name} registered twice")
        params = tuple(p for p in inspect.signature(fn).parameters if p != "ctx")
        FUNCTIONS[name] = Function(name, signature, doc, fn, params)
        return fn
    return deco


def kernel_for(node: Tensor) -> Kernel:
    try:
        return KERNELS[node.op_desc]
    except KeyError:
        raise GGToolError(f"no kernel for op {node.op_desc} (node '{node.name}')") from None


# -- helpers for builders -------------------------------------------------------------------
def new_op(ctx: Context, op: str, type, ne, srcs=(), params=(), view_of: Tensor | None = None,
           view_offs: int = 0, unary: str | None = None, nb=None) -> Tensor:
    """Create an op's result: a new tensor, or a view of `view_of` (strides `nb`, packed if None),
    with op, src and op_params."""
    if view_of is not None:
        t = ctx.new_tensor(type, ne, view_src=view_of, view_offs=view_offs, nb=nb)
    else:
        t = ctx.new_tensor(type, ne)
    t.op = op
    t.src = list(srcs)
    if unary is not None:
        t.set_params(UNARY_OPS.index(unary))
    elif params:
        t.set_params(*params)
    return t


def view_tensor(ctx: Context, a: Tensor) -> Tensor:
    """ggml_view_tensor: same ne/nb as a, named "<a> (view)"."""
    t = ctx.new_tensor(a.type, a.ne, view_src=a, view_offs=0, nb=a.nb)
    t.name = f"{a.name} (view)"
    return t


def fmt_ne(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.ne) + "]"


def check(cond: bool, op: str, msg: str) -> None:
    """A construction-time GGML_ASSERT, as a clear error naming the op."""
    if not cond:
        raise ShapeError(f"{op}: {msg}")



# -- helpers for kernels ---------------------------------------------------------------------
def row_block(nr: int, ith: int, nth: int) -> tuple[int, int]:
    """GGML's contiguous row split: dr = ceil(nr/nth), rows [dr*ith, min(dr*ith+dr, nr))."""
    dr = (nr + nth - 1) // nth
    ir0 = min(dr * ith, nr)
    return ir0, min(ir0 + dr, nr)


def rows(a: np.ndarray) -> np.ndarray:
    """(ne3, ne2, ne1, ne0) -> (nrows, ne0) without copying when the layout allows it."""
    return a.reshape(-1, a.shape[-1])

