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


class OutOfMemoryError(GGToolError):
    """Memory for a tensor, the work buffer or the compute buffer could not be had; says how many
    bytes were needed (`needed`: what was asked for, `total`: what the memory would have held)."""

    def __init__(self, what: str, needed: int, total: int | None = None):
        self.what, self.needed, self.total = what, needed, total
        msg = f"out of memory: {what} needs {needed} bytes ({human_bytes(needed)})"
        if total is not None and total > needed:
            msg += f", the context {total} bytes in all"
        limit = memory_limit()
        msg += "; that much memory cannot be had"
        if limit:
            msg += f" (this machine has {human_bytes(limit)}, swap included)"
        super().__init__(msg)


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; bytes below 1 KiB as they are."""
    value, unit = float(n), "bytes"
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024:
            break
        value, unit = value / 1024, u
    if unit == "bytes":
        return f"{n} bytes"
    return f"{value:.1f} {unit}" if value < 1e6 else f"{value:.3g} {unit}"


def memory_limit() -> int | None:
    """The most memory this process can fill: physical memory (or the cgroup's limit, if lower)
    plus swap. None where it cannot be read."""
    import os

    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover
        return None
    swap = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("SwapTotal:"):
                    swap = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # pragma: no cover
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            ram = min(ram, int(text))
        break
    return ram + swap


class GraphFullError(GGToolError):
    """More nodes or leafs than the graph was created for."""


class ComputeError(GGToolError):
    """A kernel failed; names the node, its op and the cause."""


class InputError(GGToolError):
    """A tensor source (file, JSON, GGUF) could not be loaded."""


class QuantizationError(GGToolError):
    """Data cannot be quantized (NaN/inf, bad row length)."""
