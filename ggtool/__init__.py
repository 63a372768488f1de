"""ggtool: GGML's context-mode machinery (context, tensors, ops, graph, plan, compute) in Python."""

from . import ops
from .context import Context
from .errors import (ComputeError, ContextMemoryError, GGToolError, GraphFullError, InputError,
                     QuantizationError, ShapeError)
from .graph import Graph, graph_overhead
from .plan import Plan, make_plan
from .tensor import Tensor
from .types import GGMLType

__version__ = "0.1.0"

__all__ = ["Context", "Tensor", "Graph", "Plan", "GGMLType", "make_plan", "graph_overhead", "ops",
           "GGToolError", "ShapeError", "ContextMemoryError", "GraphFullError", "ComputeError",
           "InputError", "QuantizationError"]
