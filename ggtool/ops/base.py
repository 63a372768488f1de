"""The op registry. A family module declares, side by side, each op's builder (shape rule and
asserts), its n_tasks, its work size and its forward kernel:

    @kernel("ADD", n_tasks=ALL, work_size=lambda node, n_tasks: 0)
    def forward_add(node, ith, nth, work): ...          # writes rows of node.data

    @function("add", "ggml_add(ctx, a, b)", "a + b; b is tiled over a (modulo)")
    def add(ctx, a, b): ...                            # returns the new Tensor

Kernels take GGML's (ith, nth) and must touch only their own slice, so the worker pool can run
them unchanged in several processes. `work.wdata` is the plan's work buffer (uint8, shared) and
`work.barrier()` is the barrier for ops that need one inside (mul_mat after converting src1).

Two more things an op may declare beside its kernel:

- `split`: who computes a node at run time. GGML runs every node on every thread (`nth` is the
  plan's thread count whatever the node's n_tasks); an op whose forward returns unless `ith == 0`
  is ONE, the others ALL (SUB, SCALE, GET_ROWS and SET_ROWS split rows over every thread although
  their n_tasks is 1). Default: ALL where n_tasks is not 1, else ONE.
- `compiled`: `(node, numerics) -> CompiledStep, a tuple of them, or None`: the node as the compiled
  graph runner runs it (``ggtool.runner``): which kernel of ``ggtool.kernels.nodes`` and the op's
  parameters, checked here against what that kernel handles (types, strides); None leaves the node
  to `forward` in Python. The compiled kernel gives the same bits as `forward`.
- `fuse`: `(node, next node, numerics) -> CompiledStep or None`: both nodes in one step where GGML's
  CPU backend fuses them (ggml_cpu_try_fuse_ops: RMS_NORM then MUL), the bits of the two unchanged;
  the runner asks only where the node's one consumer is the next node and its result is no output.
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
ONE = 1   # split: participant 0 alone computes the node

SPLIT_ALL, SPLIT_ONE = "all", "one"

KERNELS: dict[str, Kernel] = {}
FUNCTIONS: dict[str, Function] = {}


@dataclass(frozen=True)
class CompiledStep:
    """One step of a node in the compiled runner: a kernel of ``ggtool.kernels.nodes`` (by name), the
    op's int and float parameters (the kernel's own layout), the tensors its table row describes
    (None: the node, then its sources), and `bind`: per process, (ith, nth, shared) -> (more ints,
    objects to keep alive, a prologue run before each compute or None): what only the process that
    runs the step can know (addresses of its own arrays: repacked weights, a rope cache; `shared`, a
    dict for the whole graph in this process, lets nodes share such arrays and prologues). `needs`: other compiled
    kernels the step runs (``kernels.cache`` names: its bind's packers), which the process that plans
    wants compiled before it compiles the step. `stable`: tensors whose bytes `bind` reads (weights it
    repacks): the step is compiled only where the graph neither computes nor writes them. `deals`: the
    kernel deals its units out as GGML deals out chunks (each participant takes the next from the
    barrier block's counter, ``kernels.runner.CHUNK``, whose address the runner puts at
    ``nodes.CHUNK_ADDR`` in its row), so `bind` binds every unit in every process. Which steps
    a node has depends on the node and the numerics only: every process finds the same."""
    kernel: str
    ints: tuple = ()
    floats: tuple = ()
    tensors: tuple | None = None
    bind: Callable | None = None
    needs: tuple = ()
    stable: tuple = ()
    deals: bool = False


@dataclass
class Kernel:
    op: str                                   # ggml_op_desc: "ADD", "MUL_MAT", "GELU", ...
    forward: Callable | None                  # (node, ith, nth, work) -> None; None for no-ops
    tasks: int | Callable = 1                 # ALL, a number, or (node, n_threads) -> int
    work: Callable | None = None              # (node, n_tasks) -> bytes
    split: str | None = None                  # SPLIT_ALL / SPLIT_ONE (None: from tasks)
    compiled: Callable | None = None          # (node, numerics) -> CompiledStep(s) or None
    fuse: Callable | None = None              # (node, next node, numerics) -> CompiledStep or None

    def splits(self) -> bool:
        """Whether every participant computes a share of the node (GGML's compute-time split)."""
        if self.split is not None:
            return self.split == SPLIT_ALL
        return self.tasks != 1

    def steps(self, node: Tensor, numerics: str) -> tuple:
        """The node's compiled steps, () where it has none."""
        if self.compiled is None:
            return ()
        got = self.compiled(node, numerics)
        if got is None:
            return ()
        return got if isinstance(got, tuple) else (got,)

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


def kernel(op: str, n_tasks: int | Callable = 1, work_size: Callable | None = None, split: str | None = None,
           compiled: Callable | None = None, fuse: Callable | None = None):
    def deco(fn):
        if op in KERNELS:
            raise RuntimeError(f"kernel {op} registered twice")
        KERNELS[op] = Kernel(op, fn, n_tasks, work_size, split, compiled, fuse)
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

