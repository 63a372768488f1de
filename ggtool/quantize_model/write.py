"""Running a quantization plan: the writing loop, streaming converted pieces into the output.

Streaming: header, metadata and tensor infos are written first, then each tensor's data, converted
in row pieces on threads (the compiled kernels release the GIL); peak memory is about one window
of pieces, not the model.  The output goes to a temporary file beside OUTPUT and is renamed at the
end; any error or KeyboardInterrupt removes it.  A plan of several files (keep_split) writes each to
its own temporary file, all renamed at the end.

The conversion of one piece is a collaborator (`RowConverter`, `convert_rows` by default), so that
a caller (or a test) can wrap it without patching this module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from .. import quant as Q
from .. import types as T
from ..errors import GGToolError
from ..gguf_io.write import check_output_paths, copy_file_bytes
from ..tensor_io import atomic_paths, named_write_errors
from .convert import (
    Piece,
    convert_rows,
    npy_copy,
    npy_rows,
    pieces,
    source_bytes,
    source_rows,
    source_values,
    validate_piece,
    windows,
)
from .rules import OutputFile, QuantizeOptions, QuantizePlan, TensorPlan, header_bytes, plan_quantization

PIECE_BYTES = 4 << 20                         # f32 bytes of one conversion task
WINDOW_BYTES = 32 << 20                       # f32 bytes converted between two writes, per thread


class RowConverter(Protocol):
    """Converts rows r0.. of tensor `name` (numpy `shape`) from src_type to dst_type: their bytes
    (`imatrix`: the tensor's importances, per column or per expert and column, or None)."""

    def __call__(self, x, src_type: T.GGMLType, dst_type: T.GGMLType, name: str, shape: tuple[int, ...],
                 r0: int, imatrix=None) -> bytes: ...


@dataclass
class QuantizeResult:
    plan: QuantizePlan
    output: str
    file_bytes: int              # all files together
    seconds: float
    outputs: list[str]           # the files written: [output], or its shards


def preflight(plan: QuantizePlan, output_path: str, *, force: bool = False) -> list[str]:
    """What the run checks before it writes a byte, for a dry run to say too: the plan's refusals
    (a dry run's plan keeps them: a tensor that needs an importance matrix), then every output new
    (or `force`), writable and none an input. Raises the first; returns the output paths."""
    if plan.refusals:
        raise plan.refusals[0]
    outputs = plan.output_paths(output_path)
    check_output_paths(plan.sources or plan.input, outputs, force)
    return outputs


def run_quantization(plan: QuantizePlan, output_path: str, *, force: bool = False,
                     on_start: Callable[[TensorPlan], None] | None = None,
                     on_done: Callable[[TensorPlan], None] | None = None,
                     on_bytes: Callable[[int], None] | None = None,
                     converter: RowConverter = convert_rows) -> QuantizeResult:
    """Write the quantized model to output_path (or its shards) atomically (temporary files + renames).

    Work is cut into pieces of about PIECE_BYTES of f32 (a tensor or some of its rows), converted
    a window at a time on `threads` threads (each piece on one, by `converter`); the results are
    written in file order, so memory stays at a window of converted bytes.  Callbacks: on_start(t)
    before a tensor's data is written, on_done(t) after it, on_bytes(n) as source bytes are consumed."""
    outputs = preflight(plan, output_path, force=force)
    t0 = time.perf_counter()
    threads = max(1, int(plan.options.threads))
    executor = ThreadPoolExecutor(threads, thread_name_prefix="ggtool-quantize") if threads > 1 else None

    def produce(it: Piece):
        """A piece's bytes, validated (the one place every byte of tensor data is checked before
        it is written): converted rows, or a copied tensor's (None: copied from the input file)."""
        t = it.t
        if t.copy:
            data = npy_copy(plan, t) if plan.npy is not None else source_bytes(t.src_path, t.src_offset, t.src_bytes)
            source = None
        else:
            x = (npy_rows(plan, it) if plan.npy is not None else
                 source_rows(t.src_path, t.src_offset, t.src_type, t.ne[0], it.r0, it.r1))
            data = converter(x, t.src_type, t.dst_type, t.name, tuple(t.ne[::-1]), it.r0, imatrix=t.imatrix)
            source = lambda: source_values(x, t.src_type)   # noqa: E731 (read only to word an error)
        validate_piece(data, t, it.r0, source)
        return None if t.copy and plan.npy is None else data

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
        for window in windows(pieces(out.tensors, PIECE_BYTES), WINDOW_BYTES * threads):
            results = iter(executor.map(produce, window) if executor is not None and len(window) > 1
                           else map(produce, window))
            for it in window:
                t = it.t
                if it.first:
                    if pos != t.dst_offset:      # the header's offsets are what readers trust
                        raise GGToolError(f"internal error: tensor '{t.name}' would start at data offset {pos}, "
                                          f"the header says {t.dst_offset}")
                    if on_start:
                        on_start(t)
                    written = 0
                data = next(results)
                if t.copy:
                    if data is None:
                        copy_file_bytes(t.src_path, t.src_offset, t.src_bytes, f.fileno(), write, on_bytes)
                    else:
                        write(data)
                        if on_bytes:
                            on_bytes(len(data))
                    written = t.src_bytes
                else:
                    write(data)
                    written += len(data)
                    if on_bytes:
                        on_bytes(round(len(data) * t.src_bytes / max(1, t.dst_bytes)))
                if it.last:
                    if written != t.dst_bytes:  # pragma: no cover - a bug, not bad input
                        raise GGToolError(f"internal error: tensor '{t.name}' produced {written} bytes, "
                                          f"expected {t.dst_bytes}")
                    end = T.pad(t.dst_offset + written, out.alignment)
                    write(b"\0" * (end - t.dst_offset - written))
                    pos = end
                    if on_done:
                        on_done(t)
        if len(head) + pos != out.size():     # checked before the temporary file is renamed
            raise GGToolError(f"internal error: {path}: wrote {len(head) + pos} bytes, planned {out.size()}")
        return len(head) + pos

    size = 0
    try:
        # the parallelism is across pieces: the array-level quantizers run on one thread each;
        # atomic_paths: a temporary file beside each output, moved into place (with the normal
        # new-file mode) only when every file has been written, all removed on any error or
        # Ctrl-C; without `force` none replaces a file, even one made while this one wrote (of
        # writers racing for a new name one wins, the others say it exists); a FIFO or a device
        # output is written in place.
        with Q.threads_set_to(1), atomic_paths(outputs, replace=force) as tmps:
            for out, path, tmp in zip(plan.files, outputs, tmps):
                with open(tmp, "wb", buffering=0) as f:
                    size += write_file(out, f, path)
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
    return QuantizeResult(plan, output_path, size, time.perf_counter() - t0, outputs)


def quantize_file(input_path, output_path, opts: QuantizeOptions | None = None, force: bool = False,
                  **run_options) -> QuantizeResult:
    """plan_quantization + run_quantization (run_options: its callbacks and converter)."""
    opts = opts or QuantizeOptions()
    plan = plan_quantization(input_path, opts)
    return run_quantization(plan, os.fspath(output_path), force=force, **run_options)
