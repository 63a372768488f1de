"""Whole-model quantization: a GGUF model (or a .npy array) to a Q4_0 / Q8_0 GGUF file.

This package runs a plan and is the API the `quantize` command uses; it re-exports the names of
`.rules` (which type each tensor gets: llama.cpp's rules, the plan, the header) and uses `.convert`
(pieces of rows converted on threads: the compiled kernels release the GIL).  The writing loop stays here, not in a
submodule, so that `check_paths` and `_convert_rows` are looked up in this namespace: patching
`ggtool.quantize_model.<name>` (as the tests do) reaches the loop.

Streaming: header, metadata and tensor infos are written first, then each tensor's data, converted
in row chunks; peak memory is about one chunk per worker, not the model.  The output goes to a
temporary file beside OUTPUT and is renamed at the end; any error or KeyboardInterrupt removes it.
"""

from __future__ import annotations

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
    QuantizeOptions,
    QuantizePlan,
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
    "PIECE_BYTES",
    "TARGET_TYPES",
    "WINDOW_BYTES",
    "QuantizeOptions",
    "QuantizePlan",
    "QuantizeResult",
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
    file_bytes: int
    seconds: float


# ------------------------------------------------------------------------------------------ running

def check_paths(input_path: str, output_path: str, force: bool) -> None:
    if output_path == "-":
        raise GGToolError("OUTPUT must be a file (a GGUF file cannot be streamed to stdout)")
    ip, op = os.path.abspath(input_path), os.path.abspath(output_path)
    same = ip == op
    if not same and os.path.exists(op):
        try:
            same = os.path.samefile(ip, op)
        except OSError:
            same = False
    if same:
        raise GGToolError(f"INPUT and OUTPUT are the same file ({output_path}); write to another path")
    if os.path.isdir(op):
        raise GGToolError(f"{output_path} is a directory")
    if os.path.exists(op) and not force:
        raise GGToolError(f"{output_path} exists (use --force to overwrite it)")
    d = os.path.dirname(op) or "."
    if not os.path.isdir(d):
        raise GGToolError(f"{output_path}: directory {d} does not exist")


def run_quantization(plan: QuantizePlan, output_path: str, *, force: bool = False,
                     on_start: Callable[[TensorPlan], None] | None = None,
                     on_done: Callable[[TensorPlan], None] | None = None,
                     on_bytes: Callable[[int], None] | None = None) -> QuantizeResult:
    """Write the quantized model to output_path atomically (temporary file + rename).

    Work is cut into pieces of about PIECE_BYTES of f32 (a tensor or some of its rows), converted
    a window at a time on `threads` threads (each piece on one); the results are written in file
    order, so memory stays at a window of converted bytes.  Callbacks: on_start(t) before a
    tensor's data is written, on_done(t) after it, on_bytes(n) as source bytes are consumed."""
    check_paths(plan.input, output_path, force)
    t0 = time.perf_counter()
    threads = max(1, int(plan.options.threads))
    saved_threads = Q._threads
    executor = ThreadPoolExecutor(threads, thread_name_prefix="ggtool-quantize") if threads > 1 else None

    def convert(it: _Item) -> bytes:
        t = it.t
        x = (_npy_rows(plan, it) if plan.npy is not None else
             _source_rows(plan.input, t.src_offset, t.src_type, t.ne[0], it.r0, it.r1))
        return _convert_rows(x, t.src_type, t.dst_type, t.name, tuple(t.ne[::-1]), it.r0)

    try:
        Q.set_threads(1)                            # the parallelism is across pieces
        # atomic_path: a temporary file beside OUTPUT, renamed over it (with the normal new-file
        # mode) only if the block succeeds, removed on any error or Ctrl-C; a FIFO or a device
        # OUTPUT is written in place.
        with atomic_path(output_path) as tmp, open(tmp, "wb", buffering=0) as f:
            def write(buf):
                mv = memoryview(buf).cast("B")
                with named_write_errors(output_path):
                    while len(mv):
                        n = f.write(mv)
                        mv = mv[n:]

            head = header_bytes(plan)
            write(head)
            pos = 0
            items = _items(plan, PIECE_BYTES)
            for window in _windows(items, WINDOW_BYTES * threads):
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
                        end = _pad(t.dst_offset + written, plan.alignment)
                        write(b"\0" * (end - t.dst_offset - written))
                        pos = end
                        if on_done:
                            on_done(t)
            size = len(head) + pos
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        Q.set_threads(saved_threads)
    return QuantizeResult(plan, output_path, size, time.perf_counter() - t0)


def quantize_file(input_path, output_path, opts: QuantizeOptions | None = None, force: bool = False,
                  **callbacks) -> QuantizeResult:
    """plan_quantization + run_quantization."""
    opts = opts or QuantizeOptions()
    plan = plan_quantization(input_path, opts)
    return run_quantization(plan, os.fspath(output_path), force=force, **callbacks)
