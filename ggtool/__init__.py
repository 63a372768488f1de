"""ggtool: GGML's context-mode machinery (context, tensors, ops, graph, plan, compute) in Python.

    import ggtool
    ctx = ggtool.Context()                       # ggml_init
    g = ctx.new_graph().expand(tensor)           # ggml_build_forward_expand
    g.compute(2, pool=ggtool.get_pool(2))        # ggml_graph_compute on 2 participants

The worker pool, the quantizers and the DSL load on first use (`ggtool.WorkerPool`,
`ggtool.quantize_q4_0`, `ggtool.dsl`), so a small compute does not pay for their imports.
"""

from . import ops
from .context import Context
from .errors import (
    ComputeError,
    ContextMemoryError,
    GGToolError,
    GraphFullError,
    InputError,
    QuantizationError,
    ShapeError,
)
from .graph import Graph, graph_overhead
from .plan import Plan, make_plan
from .tensor import Tensor
from .types import GGMLType

__version__ = "0.1.0"

_LAZY = {
    "WorkerPool": "pool", "get_pool": "pool", "close_pool": "pool",
    "quantize_q4_0": "quant", "dequantize_q4_0": "quant", "quantize_q8_0": "quant",
    "dequantize_q8_0": "quant", "quantize": "quant", "dequantize": "quant", "fp32_to_fp16": "quant",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ggtool' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "ComputeError", "Context", "ContextMemoryError", "GGMLType", "GGToolError", "Graph", "GraphFullError",
    "InputError", "Plan", "QuantizationError", "ShapeError", "Tensor", "graph_overhead", "make_plan", "ops",
    *_LAZY,
]
