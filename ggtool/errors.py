"""Exceptions and warnings the engine raises, and the one "did you mean" rule their messages use.

Every GGToolError's str() names what and where in the engine's own words (never a command-line
option); a front end that wants its own wording reads the fields: `kind` names the problem for a
machine (None for most), and subclasses carry what and where (InputError: the input, file and
tensor). The command line words them with its flags (commands/wording.py). A GGToolWarning
(`warnings.warn`) says what changes no result, e.g. a cache that was not used; the command line
prints each as one `Warning: ...` line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType


class GGToolError(Exception):
    """Base class: a user-facing problem with a message that names what and where.

    `kind` is a machine-readable name for the problem ("missing-input", "ambiguous-tensor", ...)
    and `details` what a front end needs to word a hint for it; both are empty for most errors."""

    kind: str | None = None
    details: Mapping = MappingProxyType({})  # errors that have details get their own


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
    """A tensor source (file, JSON, GGUF) could not be loaded.

    What: `message`, then `hint` (advice in the engine's words, "; did you mean 'x'?", which a front
    end may replace with its own). Where: `input` is the name of the named input it came from,
    `file` the file involved (with no `input`: a GGUF file given whole, its tensors offered by
    name), `tensor` a tensor of that file. str() is "input 'x': MESSAGE HINT", "FILE: MESSAGE
    HINT" or "MESSAGE HINT". `kind` and `details` as for every GGToolError.
    """

    def __init__(self, message: str, *, hint: str = "", input: str | None = None, file: str | None = None,
                 tensor: str | None = None, kind: str | None = None, **details):
        self.message, self.hint = message, hint
        self.input, self.file, self.tensor = input, file, tensor
        self.kind, self.details = kind, details
        super().__init__(self.worded())

    def worded(self, input_label=lambda name: f"input '{name}'", file_label=str, hint: str | None = None) -> str:
        """The message with its location worded by the caller (`input_label(name)` for a named
        input, `file_label(path)` for a file given whole) and `hint` in place of the engine's."""
        text = self.message + (self.hint if hint is None else hint)
        if self.input is not None:
            return f"{input_label(self.input)}: {text}"
        if self.file is not None:
            return f"{file_label(self.file)}: {text}"
        return text

    def at(self, input: str | None = None, within: str | None = None, file: str | None = None,
           tensor: str | None = None) -> InputError:
        """This error located at the named input `input` (unless it has one already), its message
        prefixed with `within` (a file, "stdin"): what a reader that knows no names raised, as its
        caller reports it. `file` and `tensor` fill those fields where they are empty."""
        if self.input is not None:
            return self
        message = f"{within}: {self.message}" if within else self.message
        return type(self)(message, hint=self.hint, input=input, file=self.file or file, tensor=self.tensor or tensor,
                          kind=self.kind, **self.details)


def did_you_mean(name: str, candidates: Iterable[str], most: int = 3) -> str:
    """"did you mean 'x' or 'y'?" for the candidates close to `name` (difflib's ratio, 0.6), or ''."""
    import difflib  # only for an error

    close = difflib.get_close_matches(name, sorted(set(candidates)), n=most, cutoff=0.6)
    if not close:
        return ""
    return "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


class QuantizationError(GGToolError):
    """Data cannot be quantized (NaN/inf, bad row length)."""


class ImatrixError(InputError):
    """An importance-matrix file (llama-imatrix's GGUF or legacy .dat) cannot be used: `file` is
    the file, `tensor` the entry (a weight's name) where one is at fault, `kind` one of
    "truncated", "format", "metadata", "values" (NaN/inf) or "size" (an entry's length does not fit
    its tensor)."""


class GGToolWarning(UserWarning):
    """Base class of the engine's warnings: something the user should know that changes no result.
    The command line prints each as one `Warning: ...` line."""


class CacheWarning(GGToolWarning):
    """ggtool's cache on disk was not used, or held something that was refused and rebuilt
    (ggtool.kernels.cache, ggtool.quant.packs): the results are the same, only slower."""


def warnings_as_lines() -> None:
    """Show every GGToolWarning from now on as one `Warning: <message>` line on stderr, other warnings
    as Python does: the command line's way (its pool's workers inherit it, or are told to)."""
    import sys
    import warnings

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if isinstance(category, type) and issubclass(category, GGToolWarning):
            try:
                sys.stderr.write(f"Warning: {message}\n")
                sys.stderr.flush()
            except (OSError, ValueError, AttributeError):   # no stderr, or nobody reads it
                pass
        else:
            shown(message, category, filename, lineno, file, line)

    if not getattr(shown, "ggtool_lines", False):    # installed once
        show.ggtool_lines = True
        warnings.showwarning = show
