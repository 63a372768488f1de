"""Every op, one family per module; importing this package registers them all."""

from dataclasses import dataclass

# importing a family module registers its kernels and functions
from . import binary, copy, layout, leaf, matmul, norm, reduce, rope, rows, scale, softmax, unary  # noqa: F401
from .base import ALL, FUNCTIONS, KERNELS, Function, Kernel, function, kernel, kernel_for

__all__ = ["ALL", "FUNCTIONS", "KERNELS", "Function", "Kernel", "LlamaCppGap", "function", "kernel", "kernel_for",
           "llama_cpp_gaps"]


@dataclass(frozen=True)
class LlamaCppGap:
    """Nodes that compute in GGML's order under llama.cpp's numerics, where llama.cpp's x86 build
    computes otherwise: one op (and for mul_mat one weight type), in graph order."""

    op: str                 # ggml_op_desc: "MUL_MAT", "SILU"
    weight_type: str | None  # mul_mat's weight type name ("q4_1"), else None
    nodes: tuple


def llama_cpp_gaps(nodes) -> list[LlamaCppGap]:
    """What ``numerics="llama.cpp*"`` leaves in GGML's order among `nodes` (a graph's): mul_mat with
    weights of no modelled llama.cpp order (``matmul.without_x86_order``, ``matmul.x86_covered``) and
    the unary ops llama.cpp's build evaluates its own way (``unary.X86_UNMODELLED``), grouped by op
    and weight type in order of first appearance. Empty where the numerics cover every node."""
    from .. import types as T

    groups: dict[tuple, list] = {}
    for n in [*matmul.without_x86_order(nodes), *unary.without_x86_form(nodes)]:
        key = (n.op_desc, T.type_name(n.src[0].type) if n.op == "MUL_MAT" else None)
        groups.setdefault(key, []).append(n)
    order = {id(n): i for i, n in enumerate(nodes)}
    found = [LlamaCppGap(op, wt, tuple(sorted(g, key=lambda n: order[id(n)]))) for (op, wt), g in groups.items()]
    return sorted(found, key=lambda gap: order[id(gap.nodes[0])])
