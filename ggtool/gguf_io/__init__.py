"""GGUF files on disk: opening, checking, memory-mapping and describing them.

A package of its own because the engine (context, ops, graph, pool) never parses a file: it only
sees a tensor's storage.  Everything that knows the GGUF format lives behind this one door (gguf-py's
reader with every defect turned into one InputError, split models opened whole, the map each worker
process re-opens by path, what `inspect` and `compare` report, and in `.format` GGML's limits and
the split-model names that the writers share without importing gguf-py), so a change of format or
of gguf-py is made here alone.

The names below load on first use: a pool worker unpickling a FileStorage imports `.storage` only,
not the reader, and `.inspect` (which needs the quantizers) is imported only by who uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .reader import GGUFFile, TensorInfo, open_gguf
    from .storage import FileStorage

_LAZY = {"FileStorage": "storage", "GGUFFile": "reader", "TensorInfo": "reader", "open_gguf": "reader"}

__all__ = ["FileStorage", "GGUFFile", "TensorInfo", "open_gguf"]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
