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

import sys
import types
from typing import TYPE_CHECKING

from .. import role

if TYPE_CHECKING:
    from .reader import GGUFFile, TensorInfo, open_gguf
    from .storage import FileStorage

_LAZY = {"FileStorage": "storage", "GGUFFile": "reader", "TensorInfo": "reader", "open_gguf": "reader"}

__all__ = ["FileStorage", "GGUFFile", "TensorInfo", "open_gguf"]


class _YamlOnFirstUse(types.ModuleType):
    """`yaml` in ggtool's command line until something uses it: PyYAML, imported at the first
    attribute asked for, then this module holds its names. (importlib's LazyLoader would not do: the
    next `import yaml` reads the module's __spec__, which loads it.)"""

    def __getattr__(self, name: str):
        if sys.modules.get("yaml") is self:
            del sys.modules["yaml"]
        import importlib

        try:
            real = importlib.import_module("yaml")
        finally:
            sys.modules.setdefault("yaml", self)
        self.__dict__.update({k: v for k, v in vars(real).items() if k != "__class__"})
        sys.modules["yaml"] = real
        return getattr(real, name)


def yaml_on_first_use() -> None:
    """Called before gguf-py is imported (``reader``). gguf-py imports PyYAML with itself, for the
    model cards of gguf.metadata, which ggtool never reads: ~20 ms of every GGUF command's start.
    In ggtool's own command line (role.COMMAND_LINE)
    `yaml` is a stand-in that imports it when first used, if ever (`import yaml` succeeds as
    before: numba still reads a .numba_config.yaml, as it did with gguf-py's yaml)."""
    if not role.COMMAND_LINE or "yaml" in sys.modules or "gguf" in sys.modules:
        return
    import importlib.util

    try:
        spec = importlib.util.find_spec("yaml")
    except (ImportError, ValueError):
        return
    if spec is None:
        return               # gguf-py's own import then says what is missing
    module = _YamlOnFirstUse("yaml")
    module.__spec__ = spec
    sys.modules["yaml"] = module



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
