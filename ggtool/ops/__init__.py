"""Every op, one family per module; importing this package registers them all."""

# importing a family module registers its kernels and functions
from . import binary, copy, layout, leaf, matmul, norm, reduce, rope, rows, scale, softmax, unary  # noqa: F401
from .base import ALL, FUNCTIONS, KERNELS, Function, Kernel, function, kernel, kernel_for

__all__ = ["ALL", "FUNCTIONS", "KERNELS", "Function", "Kernel", "function", "kernel", "kernel_for"]
