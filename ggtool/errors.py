"""Exceptions the engine raises. The CLI turns every GGToolError into one `Error: ...` line."""


class GGToolError(Exception):
    """Base class: a user-facing problem with a message that names what and where."""


class ShapeError(GGToolError):
    """An op was given operands GGML would reject (GGML_ASSERT at construction)."""


class ContextMemoryError(GGToolError):
    """The context's memory pool is too small (GGML logs, then aborts or segfaults)."""

    def __init__(self, needed: int, available: int):
        self.needed, self.available = needed, available
        super().__init__(
            "not enough space in the context's memory pool "
            f"(needed {needed}, available {available})"
        )


class GraphFullError(GGToolError):
    """More nodes or leafs than the graph was created for."""


class ComputeError(GGToolError):
    """A kernel failed; names the node, its op and the cause."""


class InputError(GGToolError):
    """A tensor source (file, JSON, GGUF) could not be loaded."""


class QuantizationError(GGToolError):
    """Data cannot be quantized (NaN/inf, bad row length)."""
