"""Whole-model quantization: a GGUF model (or a .npy array) to a Q4_0 / Q8_0 GGUF file.

This package runs a plan and is the API the `quantize` command uses; it re-exports the names of
`.rules` (which type each tensor gets: llama.cpp's rules, the plan, the header) and uses `.convert`
(pieces of rows converted on threads: the compiled kernels release the GIL).  The writing loop stays here, not in a
submodule, so that `check_paths` and `_convert_rows` are looked up in this namespace: patching
`ggtool.quantize_model.<name>` (as the tests do) reaches the loop.

Streaming: header, metadata and tensor infos are written first, then each tensor's data, converted
in row chunks; peak memory is about one chunk per worker, not the model.  The output goes to a
temporary file beside OUTPUT and is renamed at the end; any error or KeyboardInterrupt removes it.
A plan of several files (keep_split) writes each to its own temporary file, all renamed at the end.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .. import quant as Q
from ..errors import GGToolError
from ..tensor_io import atomic_path, named_write_errors
from .convert import (
    _convert_rows,
    _copy_tensor,
    _Item,
    _items,
    _npy_rows,
    _source_rows,
    _windows,
)
from .rules import (
    FILE_TYPES,
    GGML_QNT_VERSION,
    GGUF_DEFAULT_ALIGNMENT,
    TARGET_TYPES,
    OutputFile,
    QuantizeOptions,
    QuantizePlan,
    RequantizeError,
    TensorPlan,
    _pad,
    choose_type,
    header_bytes,
    parse_target_type,
    plan_quantization,
    tensor_bytes,
)

__all__ = [
    "FILE_TYPES",
    "GGML_QNT_VERSION",
    "GGUF_DEFAULT_ALIGNMENT",
    "OutputFile",
    "PIECE_BYTES",
    "TARGET_TYPES",
    "WINDOW_BYTES",
    "QuantizeOptions",
    "QuantizePlan",
    "QuantizeResult",
    "RequantizeError",
    "TensorPlan",
    "check_paths",
    "choose_type",
    "header_bytes",
    "parse_target_type",
    "plan_quantization",
    "quantize_file",
    "run_quantization",
    "tensor_bytes",
]

PIECE_BYTES = 4 << 20                         # f32 bytes of one conversion task
WINDOW_BYTES = 32 << 20                       # f32 bytes converted between two writes, per thread


@dataclass
class QuantizeResult:
    plan: QuantizePlan
    output: str
    file_bytes: int              # all files together
    seconds: float
    outputs: list[str]           # the files written: [output], or its shards


# ------------------------------------------------------------------------------------------ running

def check_paths(input_path: str | list[str], output_path: str | list[str], force: bool) -> None:
    """Every output file (a split output's shards) must be a new file, or one `force` may replace,
    and none an input file (a split input's shards)."""
    inputs = [input_path] if isinstance(input_path, str) else input_path
    for output in [output_path] if isinstance(output_path, str) else output_path:
        if output == "-":
            raise GGToolError("OUTPUT must be a file (a GGUF file cannot be streamed to stdout)")
        op = os.path.abspath(output)
        for ip in map(os.path.abspath, inputs):
            same = ip == op
            if not same and os.path.exists(op):
                try:
                    same = os.path.samefile(ip, op)
                except OSError:
                    same = False
            if same:
                raise GGToolError(f"INPUT and OUTPUT are the same file ({output}); write to another path")
        if os.path.isdir(op):
            raise GGToolError(f"{output} is a directory")
        if os.path.exists(op) and not force:
            raise GGToolError(f"{output} exists (use --force to overwrite it)")
        d = os.path.dirname(op) or "."
        if not os.path.isdir(d):
            raise GGToolError(f"{output}: directory {d} does not exist")


def run_quantization(plan: QuantizePlan, output_path: str, *, force: bool = False,
                     on_start: Callable[[TensorPlan], None] | None = None,
                     on_done: Callable[[TensorPlan], None] | None = None,
                     on_bytes: Callable[[int], None] | None = None) -> QuantizeResult:
    """Write the quantized model to output_path (or its shards) atomically (temporary files + renames).

    Work is cut into pieces of about PIECE_BYTES of f32 (a tensor or some of its rows), converted
    a window at a time on `threads` threads (each piece on one); the results are written in file
    order, so memory stays at a window of converted bytes.  Callbacks: on_start(t) before a
    tensor's data is written, on_done(t) after it, on_bytes(n) as source bytes are consumed."""
    outputs = plan.output_paths(output_path)
    check_paths(plan.sources or plan.input, outputs, force)
    t0 = time.perf_counter()
    threads = max(1, int(plan.options.threads))
    saved_threads = Q.threads_setting()
    executor = ThreadPoolExecutor(threads, thread_name_prefix="ggtool-quantize") if threads > 1 else None

    def convert(it: _Item) -> bytes:
        t = it.t
        x = (_npy_rows(plan, it) if plan.npy is not None else
             _source_rows(t.src_path, t.src_offset, t.src_type, t.ne[0], it.r0, it.r1))
        return _convert_rows(x, t.src_type, t.dst_type, t.name, tuple(t.ne[::-1]), it.r0)

    def write_file(out: OutputFile, f, path: str) -> int:
        def write(buf):
            mv = memoryview(buf).cast("B")
            with named_write_errors(path):
                while len(mv):
                    n = f.write(mv)
                    mv = mv[n:]

        head = header_bytes(out)
        write(head)
        pos = 0
        for window in _windows(_items(out.tensors, PIECE_BYTES), WINDOW_BYTES * threads):
            todo = [it for it in window if not it.t.copy]
            results = iter(executor.map(convert, todo) if executor is not None and len(todo) > 1
                           else map(convert, todo))
            for it in window:
                t = it.t
                if it.first:
                    if on_start:
                        on_start(t)
                    written = 0
                if t.copy:
                    _copy_tensor(plan, t, f.fileno(), write, on_bytes)
                    written = t.src_bytes
                else:
                    data = next(results)
                    write(data)
                    written += len(data)
                    if on_bytes:
                        on_bytes(round(len(data) * t.src_bytes / max(1, t.dst_bytes)))
                if it.last:
                    if written != t.dst_bytes:  # pragma: no cover - a bug, not bad input
                        raise GGToolError(f"internal error: tensor '{t.name}' produced {written} bytes, "
                                          f"expected {t.dst_bytes}")
                    end = _pad(t.dst_offset + written, out.alignment)
                    write(b"\0" * (end - t.dst_offset - written))
                    pos = end
                    if on_done:
                        on_done(t)
        return len(head) + pos

    size = 0
    try:
        Q.set_threads(1)                            # the parallelism is across pieces
        # atomic_path: a temporary file beside each output, renamed over it (with the normal
        # new-file mode) only when every file has been written, all removed on any error or Ctrl-C;
        # a FIFO or a device output is written in place.
        with contextlib.ExitStack() as renames:
            for out, path in zip(plan.files, outputs):
                tmp = renames.enter_context(atomic_path(path))
                with open(tmp, "wb", buffering=0) as f:
                    size += write_file(out, f, path)
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        Q.set_threads(saved_threads)
    return QuantizeResult(plan, output_path, size, time.perf_counter() - t0, outputs)


def quantize_file(input_path, output_path, opts: QuantizeOptions | None = None, force: bool = False,
                  **callbacks) -> QuantizeResult:
    """plan_quantization + run_quantization."""
    opts = opts or QuantizeOptions()
    plan = plan_quantization(input_path, opts)
    return run_quantization(plan, os.fspath(output_path), force=force, **callbacks)
