"""Every op, one family per module; importing this package registers them all."""

from . import binary, layout  # noqa: F401  (registration side effects)
from .base import ALL, FUNCTIONS, KERNELS, Function, Kernel, function, kernel, kernel_for

__all__ = ["ALL", "FUNCTIONS", "KERNELS", "Function", "Kernel", "function", "kernel", "kernel_for"]
