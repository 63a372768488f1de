"""Every op, one family per module; importing this package registers them all."""

from . import (binary, copy, layout, leaf, matmul, norm, reduce, rope, rows,  # noqa: F401  (registration)
               scale, softmax, unary)
from .base import ALL, FUNCTIONS, KERNELS, Function, Kernel, function, kernel, kernel_for

__all__ = ["ALL", "FUNCTIONS", "KERNELS", "Function", "Kernel", "function", "kernel", "kernel_for"]
