"""Tensors in and out of the command line: `--tensor` sources, the DSL's environment, written results.

A package of its own because it is the one place where user data meets the engine: `sources` parses
`--tensor NAME=SOURCE` and turns JSON text and .npy files into checked arrays (no context needed);
`inputs` builds `Inputs`, the DSL's lazy environment over those sources and `--gguf` files (GGUF
tensors join a context memory-mapped, in GGML's own type); `outputs` writes results as .npy or
.gguf, and the JSON text the command line formats, through `atomic_path` so that no output file is
ever half-written (and a FIFO or a device is written in place, never replaced).
"""

from __future__ import annotations

from .inputs import MMAP_TYPES, NO_DATA, Inputs
from .outputs import (
    FORMATS,
    atomic_path,
    copy_gguf,
    destination,
    format_for_path,
    named_write_errors,
    remove_stale_temporaries,
    tensor_array,
    write_gguf,
    write_gguf_atomic,
    write_npy,
    write_npy_atomic,
    write_text_atomic,
)
from .sources import Source, SourceSyntaxError, convert_array, parse_json_array, parse_source, parse_tensor_option

__all__ = [
    "FORMATS", "MMAP_TYPES", "NO_DATA", "Inputs", "Source", "SourceSyntaxError", "atomic_path", "convert_array",
    "copy_gguf", "destination", "format_for_path", "named_write_errors", "parse_json_array", "parse_source",
    "parse_tensor_option", "remove_stale_temporaries", "tensor_array", "write_gguf", "write_gguf_atomic", "write_npy", "write_npy_atomic",
    "write_text_atomic",
]
