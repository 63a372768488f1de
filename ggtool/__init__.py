"""ggtool: GGML's context-mode machinery (context, tensors, ops, graph, plan, compute) in Python.

    import ggtool
    ctx = ggtool.Context()                       # ggml_init
    g = ggtool.Graph(ctx).expand(tensor)         # ggml_new_graph + ggml_build_forward_expand
    plan = ggtool.make_plan(g, 2)                # ggml_graph_plan
    ggtool.graph_compute(g, 2, pool=ggtool.get_pool(2))   # ggml_graph_compute on 2 participants

Each name is a function or class of the layer it belongs to (docs/engine.md, "Layers"): a graph
does not plan or compute itself, the layers above it do.

The worker pool, the quantizers and the DSL load on first use (`ggtool.WorkerPool`,
`ggtool.quantize_q4_0`, `ggtool.dsl`), so a small compute does not pay for their imports.
"""

from .errors import (
    ComputeError,
    ContextMemoryError,
    GGToolError,
    GraphFullError,
    InputError,
    QuantizationError,
    ShapeError,
)

__version__ = "0.1.0"

# Loaded on first use, so that `ggtool.pool.launch` can start workers before numpy loads, and a
# small compute does not pay for the pool's, the quantizers' or the DSL's imports.
_LAZY = {
    "Context": "context", "Graph": "graph", "graph_overhead": "graph", "Plan": "plan", "make_plan": "plan",
    "allocate": "alloc", "graph_compute": "compute",
    "Tensor": "tensor", "GGMLType": "types",
    "WorkerPool": "pool", "get_pool": "pool", "close_pool": "pool",
    "quantize_q4_0": "quant", "dequantize_q4_0": "quant", "quantize_q8_0": "quant",
    "dequantize_q8_0": "quant", "quantize": "quant", "dequantize": "quant", "fp32_to_fp16": "quant",
    "compile_kernels": "compiling.ahead_of_time", "kernel_states": "compiling.ahead_of_time",
}


def __getattr__(name: str):
    import importlib

    if name == "ops":
        return importlib.import_module(".ops", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ggtool' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "ComputeError", "Context", "ContextMemoryError", "GGMLType", "GGToolError", "Graph", "GraphFullError",
    "InputError", "Plan", "QuantizationError", "ShapeError", "Tensor", "graph_overhead", "make_plan", "ops",
    *_LAZY,
]


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _find_commands_in_a_checkout() -> None:
    """The click layer, `ggtool.commands`, is the repository's commands/ folder: pyproject's
    package-dir maps it there for an install. From a plain checkout with no install, a last finder
    on sys.meta_path maps it there too, so that `python -m ggtool` runs from the repository's root;
    an install's own mapping, found first, always wins."""
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    commands = os.path.join(os.path.dirname(here), "commands")
    if os.path.isdir(os.path.join(here, "commands")) or not os.path.isfile(os.path.join(commands, "__init__.py")):
        return   # installed (ggtool/commands/ is there), or no checkout around this package

    class CheckoutCommandsFinder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "ggtool.commands":
                return None
            from importlib.util import spec_from_file_location

            return spec_from_file_location(name, os.path.join(commands, "__init__.py"),
                                           submodule_search_locations=[commands])

    sys.meta_path.append(CheckoutCommandsFinder)


_find_commands_in_a_checkout()
del _find_commands_in_a_checkout
