"""Tensors in and out: user data as checked arrays, the DSL's environment, written results.

A package of its own because it is the one place where user data meets the engine: `arrays` turns
JSON text, .npy files and GGUF tensors into checked numpy arrays and converts them to a tensor type
(no context needed); `sources` is the little language naming where an input comes from
(`x=w.npy`, `f32[4,3]`, `i32:[1,2]`, `model.gguf:TENSOR`, `-`); `inputs` builds `Inputs`, the DSL's
lazy environment over those sources and whole GGUF files (GGUF tensors join a context
memory-mapped, in GGML's own type); `outputs` writes results as .npy or .gguf (the command line formats JSON text), through
`atomic_path` so that no output file is ever half-written (and a FIFO or a device is written in
place, never replaced).
"""

from __future__ import annotations

from .arrays import convert_array, default_type, gguf_array, parse_json_array, read_npy, read_npy_header
from .inputs import NO_DATA, Inputs, mmap_types
from .outputs import (
    FORMATS,
    atomic_path,
    atomic_paths,
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
from .sources import Source, SourceSyntaxError, parse_named_source, parse_source

__all__ = [
    "FORMATS", "NO_DATA", "mmap_types", "Inputs", "Source", "SourceSyntaxError", "atomic_path", "atomic_paths", "convert_array",
    "copy_gguf", "default_type", "destination", "format_for_path", "gguf_array", "named_write_errors",
    "parse_json_array", "parse_named_source", "parse_source", "read_npy", "read_npy_header", "remove_stale_temporaries",
    "tensor_array", "write_gguf", "write_gguf_atomic", "write_npy", "write_npy_atomic", "write_text_atomic",
]
