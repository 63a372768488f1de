"""Whole-model quantization: a GGUF model (or a .npy array) to a Q4_0 / Q8_0 GGUF file.

The rules are llama.cpp's (`llama_model_quantize`, Q4_0/Q8_0 file types) so the file behaves like
one `llama-quantize` writes:

* only tensors whose name ends in ``weight`` with 2 or more dims (ggml_n_dims: trailing 1s do not
  count) are quantized, never ``*_norm.weight`` nor the small/special tensors llama.cpp skips
  (``ffn_gate_inp``, positional embeddings, RWKV/Mamba small weights, ...); the rest is copied;
* default mode: ``output.weight`` (or ``token_embd.weight`` when no output.weight exists, i.e. tied)
  would be Q6_K, or Q8_0 when its row is not a multiple of 256 (k-quant fallback) or the model is
  Falcon; ggtool has no Q6_K quantizer, so where llama.cpp writes Q6_K it writes Q8_0 and warns.
  MoE models with 8 experts get Q8_0 attn_v/attn_k as in llama.cpp.  ``pure`` skips all of this;
* ``--output-tensor-type`` / ``--token-embedding-type`` override output.weight / token_embd.weight;
* a row length that is not a multiple of the chosen type's block size falls back to F16;
* a tensor whose chosen type equals its source type is copied byte for byte.

All metadata is copied verbatim (raw key/value bytes), except that ``general.quantization_version``
(2) and ``general.file_type`` are removed and appended last, as llama.cpp's gguf_set_val does, and
split keys are dropped.  Tensors are written in llama.cpp's order (non-block tensors by name, then
``blk.N.*`` by layer and name).  Source tensors are dequantized to float32 exactly as gguf-py's
``dequantize`` does; Q4_0/Q8_0 bytes come from ``ggtool.quant`` (byte-identical to GGML).

Streaming: header, metadata and tensor infos are written first, then each tensor's data, converted
in row chunks; peak memory is about one chunk per worker, not the model.  The output goes to a
temporary file beside OUTPUT and is renamed at the end; any error or KeyboardInterrupt removes it.
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import quant as Q
from . import types as T
from .errors import GGToolError, InputError, QuantizationError
from .gguf_file import GGUFFile
from .outputs import atomic_path

GGML_QNT_VERSION = 2
GGUF_DEFAULT_ALIGNMENT = 32
FILE_TYPES = {T.Q4_0: 2, T.Q8_0: 7}          # llama_ftype: LLAMA_FTYPE_MOSTLY_Q4_0 / _Q8_0
TARGET_TYPES = (T.Q4_0, T.Q8_0)
PIECE_BYTES = 4 << 20                         # f32 bytes of one conversion task
POOL_MIN_BYTES = 16 << 20                     # less conversion work than this: no worker processes
WINDOW_BYTES = 32 << 20                       # f32 bytes converted per pool round trip, per worker
QK_ = 32
_KQUANTS = {T.GGMLType.Q2_K, T.GGMLType.Q3_K, T.GGMLType.Q4_K, T.GGMLType.Q5_K, T.GGMLType.Q6_K,
            T.GGMLType.IQ4_XS, T.GGMLType.IQ2_XS, T.GGMLType.IQ2_XXS, T.GGMLType.IQ2_S,
            T.GGMLType.IQ3_XXS, T.GGMLType.IQ1_S, T.GGMLType.IQ3_S, T.GGMLType.IQ1_M}
_KQUANT_FALLBACK = {T.GGMLType.Q4_K: T.GGMLType.Q5_0, T.GGMLType.Q5_K: T.GGMLType.Q5_1,
                    T.GGMLType.Q6_K: T.Q8_0, T.GGMLType.Q2_K: T.GGMLType.IQ4_NL,
                    T.GGMLType.Q3_K: T.GGMLType.IQ4_NL}
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
# llama.cpp's llama_model_quantize: substrings / names never quantized
_SKIP_SUBSTR = ("_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
                "ssm_conv1d.weight", "shortconv.conv.weight", "time_mix_first.weight",
                "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
                "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight",
                "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
                "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
                "attn_rel_b.weight", ".position_embd.")
_SKIP_NAMES = ("position_embd.weight", "token_types.weight")


@dataclass
class QuantizeOptions:
    type: T.GGMLType = T.Q4_0
    pure: bool = False
    leave_output_tensor: bool = False
    output_tensor_type: T.GGMLType | None = None
    token_embedding_type: T.GGMLType | None = None
    threads: int = 1
    name: str | None = None        # tensor name for a .npy input


@dataclass
class TensorPlan:
    """What happens to one tensor. `ne` in ggml order; offsets absolute in the input file."""

    index: int
    name: str
    ne: tuple[int, ...]
    src_type: T.GGMLType
    dst_type: T.GGMLType
    src_offset: int
    src_bytes: int
    dst_bytes: int
    warning: str | None = None
    dst_offset: int = 0            # relative to the output's data section

    @property
    def copy(self) -> bool:
        return self.src_type == self.dst_type

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64))


@dataclass
class QuantizePlan:
    input: str
    options: QuantizeOptions
    tensors: list[TensorPlan]
    kv: list[tuple[str, bytes]]          # (key, raw key/value bytes) in output order
    alignment: int
    warnings: list[str] = field(default_factory=list)
    npy: np.ndarray | None = None        # the array of a .npy input

    @property
    def src_bytes(self) -> int:
        return sum(t.src_bytes for t in self.tensors)

    @property
    def dst_bytes(self) -> int:
        return sum(t.dst_bytes for t in self.tensors)

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def file_bytes(self) -> int:
        """Size of the output file."""
        end = _pad(self.tensors[-1].dst_offset + self.tensors[-1].dst_bytes, self.alignment) if self.tensors else 0
        return len(header_bytes(self)) + end


@dataclass
class QuantizeResult:
    plan: QuantizePlan
    output: str
    file_bytes: int
    seconds: float


# --------------------------------------------------------------------------------------------- GGUF bits

def _gguf_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _kv_u32(key: str, value: int) -> bytes:
    return _gguf_str(key) + struct.pack("<II", 4, value)   # GGUFValueType.UINT32 = 4


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _n_dims(ne) -> int:
    """ggml_n_dims: dimensions up to the last one that is not 1 (at least 1)."""
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return max(n, 1)


def _llama_order(name: str) -> tuple[int, str]:
    """llama.cpp's weight_name_comparer: layer number of 'blk.N.' (-1 if none), then name."""
    m = re.match(r"blk\.(-?\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def tensor_bytes(t: T.GGMLType, ne) -> int:
    n = int(np.prod(ne, dtype=np.int64))
    return n * T.type_size(t) // T.block_size(t)


# ------------------------------------------------------------------------------------------- the rules

def _fallback(t: T.GGMLType, ne0: int) -> T.GGMLType:
    if t in _KQUANTS and ne0 % 256:
        t = _KQUANT_FALLBACK.get(t, T.GGMLType.IQ4_NL)
    if ne0 % T.block_size(t):
        t = T.F16
    return t


def choose_type(name: str, ne, src_type: T.GGMLType, opts: QuantizeOptions, *, has_output: bool,
                arch: str = "", n_expert: int = 0) -> tuple[T.GGMLType, str | None]:
    """(type to write, warning or None) for one tensor, following llama.cpp's Q4_0/Q8_0 rules."""
    quantize = name.endswith("weight") and _n_dims(ne) >= 2
    quantize &= not any(s in name for s in _SKIP_SUBSTR) and name not in _SKIP_NAMES
    quantize &= not (opts.leave_output_tensor and name == "output.weight")
    if not quantize:
        return src_type, None
    new = opts.type
    warning = None
    ne0 = int(ne[0])
    if not opts.pure:
        is_output = name == "output.weight" or (not has_output and name == "token_embd.weight")
        if is_output:
            if opts.output_tensor_type is not None:
                new = opts.output_tensor_type
            elif arch == "falcon" or ne0 % T.block_size(new):
                new = T.Q8_0
            elif new != T.Q8_0:
                new = T.GGMLType.Q6_K
        elif name == "token_embd.weight" and opts.token_embedding_type is not None:
            new = opts.token_embedding_type
        elif n_expert == 8 and ("attn_v.weight" in name or "attn_k.weight" in name):
            new = T.Q8_0
        new = _fallback(new, ne0)
    if opts.token_embedding_type is not None and name == "token_embd.weight":
        new = opts.token_embedding_type
    if opts.output_tensor_type is not None and name == "output.weight":
        new = opts.output_tensor_type
    new = _fallback(new, ne0)
    if new not in (T.F32, T.F16) and not Q.can_quantize(new):
        if new == T.GGMLType.Q6_K:
            warning = (f"{name}: llama.cpp would write q6_K here; ggtool has no Q6_K quantizer yet, "
                       f"writing q8_0 instead")
            new = _fallback(T.Q8_0, ne0)
        else:
            raise QuantizationError(f"tensor '{name}': cannot quantize to {T.type_name(new)} "
                                    f"(not implemented)")
    return new, warning


def parse_target_type(name: str, what: str) -> T.GGMLType:
    """A type for --output-tensor-type / --token-embedding-type: one ggtool can write."""
    try:
        t = T.parse_type(name)
    except GGToolError:
        t = None
    if t is None or not (t in (T.F32, T.F16) or Q.can_quantize(t)):
        ok = "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0"
        extra = " (ggtool has no Q6_K quantizer yet)" if t == T.GGMLType.Q6_K else ""
        raise GGToolError(f"{what}: cannot write tensor type {name!r}{extra}; use one of {ok}")
    return t


# ------------------------------------------------------------------------------------------ the plan

def _is_npy(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(6) == b"\x93NUMPY"


def plan_quantization(input_path: str | os.PathLike, opts: QuantizeOptions) -> QuantizePlan:
    """Decide every tensor's type and the output layout (nothing is read but headers)."""
    path = os.fspath(input_path)
    if opts.type not in TARGET_TYPES:
        raise GGToolError(f"--type must be q4_0 or q8_0, not {T.type_name(opts.type)}")
    try:
        npy = _is_npy(path)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    if npy:
        return _plan_npy(path, opts)
    g = GGUFFile(path)
    infos = list(g.tensors.values())
    has_output = "output.weight" in g.tensors
    arch = str(g.metadata("general.architecture", ""))
    n_expert = g.metadata(f"{arch}.expert_count", 0) if arch else 0
    n_expert = int(n_expert) if isinstance(n_expert, (int, np.integer)) else 0
    alignment = g.alignment
    drop = {"general.quantization_version", "general.file_type", *_SPLIT_KEYS}
    raw = g.reader.data
    kv = [(k, bytes(raw[s:e])) for k, (s, e) in g.reader.kv_spans.items() if k not in drop]
    kv.append(("general.quantization_version", _kv_u32("general.quantization_version", GGML_QNT_VERSION)))
    kv.append(("general.file_type", _kv_u32("general.file_type", FILE_TYPES[opts.type])))
    plans, warnings = [], []
    for i, info in enumerate(sorted(infos, key=lambda t: _llama_order(t.name))):
        dst, warn = choose_type(info.name, info.ne, info.type, opts, has_output=has_output, arch=arch,
                                n_expert=n_expert)
        if warn:
            warnings.append(warn)
        if dst != info.type and not Q.can_dequantize(info.type):
            raise QuantizationError(f"tensor '{info.name}': cannot dequantize {T.type_name(info.type)}")
        plans.append(TensorPlan(i, info.name, info.ne, info.type, dst, info.offset, info.n_bytes,
                                tensor_bytes(dst, info.ne), warn))
    return _layout(QuantizePlan(path, opts, plans, kv, alignment, warnings))


def _plan_npy(path: str, opts: QuantizeOptions) -> QuantizePlan:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"{path}: not a readable .npy file ({e})") from None
    if arr.dtype.kind != "f" or arr.dtype.itemsize not in (2, 4, 8):
        raise InputError(f"{path}: cannot quantize a {arr.dtype} array (float16/32/64 expected)")
    if arr.ndim == 0 or arr.ndim > 4 or arr.size == 0:
        raise InputError(f"{path}: expected a non-empty array of 1 to 4 dimensions, got shape {arr.shape}")
    name = opts.name or os.path.splitext(os.path.basename(path))[0] or "tensor"
    src = T.F16 if arr.dtype == np.float16 else T.F32
    ne = tuple(int(d) for d in arr.shape[::-1])
    dst = opts.type
    warn = None
    if ne[0] % QK_:
        dst = T.F16
        warn = f"{name}: row length {ne[0]} is not a multiple of 32, writing f16"
    src_bytes = int(arr.size) * (2 if src == T.F16 else 4)
    tp = TensorPlan(0, name, ne, src, dst, 0, src_bytes, tensor_bytes(dst, ne), warn)
    kv = [("general.quantization_version", _kv_u32("general.quantization_version", GGML_QNT_VERSION)),
          ("general.file_type", _kv_u32("general.file_type", FILE_TYPES[opts.type]))]
    plan = QuantizePlan(path, opts, [tp], kv, GGUF_DEFAULT_ALIGNMENT, [warn] if warn else [], npy=arr)
    return _layout(plan)



def _layout(plan: QuantizePlan) -> QuantizePlan:
    off = 0
    for t in plan.tensors:
        t.dst_offset = off
        off = _pad(off + t.dst_bytes, plan.alignment)
    return plan


def header_bytes(plan: QuantizePlan) -> bytes:
    """GGUF v3 header, metadata and tensor infos, padded to the alignment."""
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(plan.tensors), len(plan.kv))]
    parts += [raw for _, raw in plan.kv]
    for t in plan.tensors:
        parts.append(_gguf_str(t.name))
        parts.append(struct.pack("<I", len(t.ne)) + struct.pack(f"<{len(t.ne)}Q", *t.ne))
        parts.append(struct.pack("<IQ", int(t.dst_type), t.dst_offset))
    head = b"".join(parts)
    return head + b"\0" * (_pad(len(head), plan.alignment) - len(head))


# ------------------------------------------------------------------------------------- conversion

def _source_rows(path: str, offset: int, src_type: T.GGMLType, ne0: int, r0: int, r1: int) -> np.ndarray:
    from .storage import FileStorage
    rb = T.row_size(src_type, ne0)
    raw = FileStorage(path).array[offset + r0 * rb: offset + r1 * rb]
    raw = raw.reshape(r1 - r0, rb)
    if T.is_quantized(src_type) or src_type == T.GGMLType.BF16:
        return raw
    return raw.view(T.np_dtype(src_type))


def _convert_rows(x, src_type: T.GGMLType, dst_type: T.GGMLType, name: str, shape, r0: int) -> bytes:
    """Convert rows [r0, r0+len(x)) of a tensor (numpy `shape`); errors name the full-tensor index."""
    try:
        if src_type in (T.F32, T.F16) and dst_type in (T.Q4_0, T.Q8_0, T.F16, T.F32):
            vals = np.asarray(x, dtype=np.float32) if src_type == T.F16 else x
        else:
            vals = Q.dequantize(x, src_type)
        out = Q.quantize(vals, dst_type, name)
    except QuantizationError as e:
        raise _relocate(e, x if src_type in (T.F32, T.F16) else Q.dequantize(x, src_type), name,
                        shape, r0) from None
    return np.ascontiguousarray(out).view(np.uint8).tobytes()


def _relocate(e: QuantizationError, vals: np.ndarray, name: str, shape, r0: int) -> QuantizationError:
    vals = np.asarray(vals)
    if vals.dtype.kind != "f":
        return e
    fin = np.isfinite(vals.reshape(-1))
    if fin.all():
        return e
    k = int(np.argmin(fin))
    v = vals.reshape(-1)[k]
    flat = r0 * vals.shape[-1] + k
    idx = tuple(int(i) for i in np.unravel_index(flat, shape))
    what = "NaN" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    return QuantizationError(f"tensor '{name}': cannot quantize {what} at index {idx}")


def _task(args) -> bytes:
    """Pool task: convert rows r0..r1 of one tensor, reading the input file itself."""
    path, offset, src, dst, ne0, r0, r1, name, shape = args
    src, dst = T.GGMLType(src), T.GGMLType(dst)
    return _convert_rows(_source_rows(path, offset, src, ne0, r0, r1), src, dst, name, shape, r0)


def _get_pool(threads: int):
    """THE seam to the worker pool (ggtool.pool's process-wide pool, `map`-like API)."""
    from .pool import get_pool
    return get_pool(threads)


def _parallel_map(fn, items: list, threads: int, pool=None) -> list:
    """[fn(x) for x in items] spread over `threads` processes of the pool."""
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    return (pool or _get_pool(threads)).map(fn, items, n_threads=threads)


def _warm(_=None) -> int:
    """A no-op task: makes a worker import this module before real work arrives."""
    return os.getpid()


class _PoolStarter:
    """Starts the pool in a background thread; conversion runs in-process until it is ready."""

    def __init__(self, threads: int):
        self.threads = threads
        self.pool = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._start, name="ggtool-pool-start", daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            pool = _get_pool(self.threads)
            pool.map(_warm, list(range(self.threads)), n_threads=self.threads)
            self.pool = pool
        except BaseException as e:  # noqa: BLE001 - reported when the pool is asked for
            self.error = e
        finally:
            self.ready.set()

    def get(self):
        """The pool if it is ready now, else None (never waits)."""
        if not self.ready.is_set():
            return None
        if self.error is not None:
            raise self.error
        return self.pool


@dataclass
class _Item:
    """One piece of output, in file order: a tensor copied verbatim, or rows r0..r1 converted."""

    t: TensorPlan
    r0: int = 0
    r1: int = 0
    first: bool = True
    last: bool = True

    @property
    def work(self) -> int:       # f32 bytes the conversion handles
        return 0 if self.t.copy else (self.r1 - self.r0) * self.t.ne[0] * 4


def _items(plan: QuantizePlan, piece_bytes: int) -> list[_Item]:
    items = []
    for t in plan.tensors:
        if t.copy:
            items.append(_Item(t))
            continue
        ne0 = t.ne[0]
        nrows = t.n_elements // ne0 if ne0 else 0
        rows = max(1, piece_bytes // (4 * max(ne0, 1)))
        starts = list(range(0, nrows, rows)) or [0]
        for k, r0 in enumerate(starts):
            items.append(_Item(t, r0, min(nrows, r0 + rows), k == 0, k == len(starts) - 1))
    return items


def _windows(items: list[_Item], window_bytes: int):
    """Consecutive runs of items holding about window_bytes of conversion work."""
    cur, work = [], 0
    for it in items:
        cur.append(it)
        work += it.work
        if work >= window_bytes:
            yield cur
            cur, work = [], 0
    if cur:
        yield cur


def _npy_rows(plan: QuantizePlan, it: _Item) -> np.ndarray:
    ne0 = it.t.ne[0]
    x = np.asarray(plan.npy.reshape(-1, ne0)[it.r0:it.r1])
    return x.astype(np.float32) if x.dtype == np.float64 else x


def _copy_tensor(plan: QuantizePlan, t: TensorPlan, out_fd: int, write, on_bytes) -> None:
    if plan.npy is not None:
        a = np.ascontiguousarray(plan.npy, dtype=np.float16 if t.src_type == T.F16 else np.float32)
        write(a.view(np.uint8).reshape(-1))
        return
    step = 64 << 20
    with open(plan.input, "rb") as src:
        done = 0
        while done < t.src_bytes:
            n = min(step, t.src_bytes - done)
            try:
                k = os.copy_file_range(src.fileno(), out_fd, n, t.src_offset + done)
            except (AttributeError, OSError):
                k = 0
            if k <= 0:   # no copy_file_range here (or it refused): through the memory map
                from .storage import FileStorage
                write(FileStorage(plan.input).array[t.src_offset + done: t.src_offset + done + n])
                k = n
            done += k
            if on_bytes:
                on_bytes(k)


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

    Work is cut into pieces of about PIECE_BYTES of f32 (a tensor or some of its rows) and handed
    to the worker pool a window at a time; the parent writes the results in file order, so memory
    stays at a window of converted bytes plus one piece per worker.  Callbacks: on_start(t) before
    a tensor's data is written, on_done(t) after it, on_bytes(n) as source bytes are consumed."""
    check_paths(plan.input, output_path, force)
    t0 = time.perf_counter()
    threads = max(1, int(plan.options.threads))
    work = sum(t.n_elements * 4 for t in plan.tensors if not t.copy)
    use_pool = threads > 1 and plan.npy is None and work >= POOL_MIN_BYTES
    src_abs = os.path.abspath(plan.input)
    saved_threads = Q._threads
    try:
        Q.set_threads(1 if use_pool else threads)   # with the pool: one thread per process
        # atomic_path: a temporary file beside OUTPUT, renamed over it (with the normal new-file
        # mode) only if the block succeeds, removed on any error or Ctrl-C.
        with atomic_path(output_path) as tmp, open(tmp, "wb", buffering=0) as f:
            def write(buf):
                mv = memoryview(buf).cast("B")
                while len(mv):
                    n = f.write(mv)
                    mv = mv[n:]

            head = header_bytes(plan)
            write(head)
            pos = 0
            items = _items(plan, PIECE_BYTES)
            starter = _PoolStarter(threads) if use_pool else None
            for window in _windows(items, WINDOW_BYTES * (threads if use_pool else 1)):
                todo = [it for it in window if not it.t.copy]
                pool = starter.get() if starter is not None and todo else None
                if pool is not None:
                    args = [(src_abs, it.t.src_offset, int(it.t.src_type), int(it.t.dst_type), it.t.ne[0],
                             it.r0, it.r1, it.t.name, tuple(it.t.ne[::-1])) for it in todo]
                    results = iter(_parallel_map(_task, args, threads, pool))
                else:
                    results = None
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
                        if results is not None:
                            data = next(results)
                        else:
                            x = (_npy_rows(plan, it) if plan.npy is not None else
                                 _source_rows(plan.input, t.src_offset, t.src_type, t.ne[0], it.r0, it.r1))
                            data = _convert_rows(x, t.src_type, t.dst_type, t.name, tuple(t.ne[::-1]), it.r0)
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
        Q.set_threads(saved_threads)
    return QuantizeResult(plan, output_path, size, time.perf_counter() - t0)


def quantize_file(input_path, output_path, opts: QuantizeOptions | None = None, force: bool = False,
                  **callbacks) -> QuantizeResult:
    """plan_quantization + run_quantization."""
    opts = opts or QuantizeOptions()
    plan = plan_quantization(input_path, opts)
    return run_quantization(plan, os.fspath(output_path), force=force, **callbacks)
