"""GGML's context: one memory pool, objects laid out one after another (ggml_init,
ggml_new_object)."""

from __future__ import annotations

import mmap
import os

import numpy as np

from . import types as T
from .errors import ContextMemoryError, GGToolError, OutOfMemoryError, ShapeError, memory_limit
from .tensor import INT64_MAX, MAX_DIMS, Tensor, byte_extent

MEM_ALIGN = 16
OBJECT_SIZE = 32
TENSOR_SIZE = 336

OBJ_TENSOR, OBJ_GRAPH, OBJ_WORK_BUFFER = 0, 1, 2


def pad(x: int, n: int = MEM_ALIGN) -> int:
    return T.pad(x, n)


class Context:
    """A memory pool of `mem_size` bytes with GGML's exact layout.

    `mem_size=None` makes a pool that grows as needed (same offsets, no upper bound); that is what
    the CLI uses, and `ggml_mem_size` then says what a fixed GGML pool would have needed. Past
    64 KiB it grows inside a reservation of address space as large as the machine's memory
    (`_reserve`): nothing is copied, and only the bytes written ever become memory.
    The pool is one contiguous numpy buffer, so it can be moved into shared memory (`rebind`).

    `measure=True` lays every object out at the offsets GGML would give it, tensor data included,
    with no memory behind them: tensors have no data (as with no_alloc), yet `used_mem` and
    `ggml_mem_size` count their bytes. Planning and inspecting a graph need only those numbers, so
    a shape of any size costs them nothing.
    """

    def __init__(self, mem_size: int | None = None, no_alloc: bool = False, measure: bool = False):
        self.no_alloc, self.measure = no_alloc, measure
        self.fixed = mem_size is not None
        if self.fixed:
            self.mem_size = pad(mem_size) if mem_size > 0 else MEM_ALIGN
            capacity = self.mem_size
        else:
            self.mem_size = None
            capacity = 1 << 16
        self.buffer = np.zeros(0 if measure else capacity, dtype=np.uint8)
        self._reserved: np.ndarray | None = None   # the address space `buffer` grows into, if any
        self.objects: list[tuple[int, int, int]] = []  # (offs, size, type)
        self.tensors: list[Tensor] = []
        self.external_bytes = 0  # data of tensors that live outside the pool (memory-mapped)
        self.compute_buffer_bytes = 0  # pool bytes of graph allocators' compute buffers (not GGML context memory)

    # -- the allocator ----------------------------------------------------------------------
    @property
    def used_mem(self) -> int:
        if not self.objects:
            return 0
        offs, size, _ = self.objects[-1]
        return offs + size

    def new_object(self, kind: int, size: int, what: str | None = None) -> int:
        """ggml_new_object: returns the payload offset (header at offset - 32). `what` names the
        object in the error raised when the memory cannot be had (OutOfMemoryError)."""
        cur_end = self.used_mem
        size_needed = pad(size)
        needed = cur_end + size_needed + OBJECT_SIZE
        if self.fixed and needed > self.mem_size:
            raise ContextMemoryError(needed, self.mem_size)
        if needed > len(self.buffer) and not self.measure:
            try:
                self._grow(needed)
            except (MemoryError, ValueError, OverflowError):   # numpy and mmap refuse in these ways
                raise OutOfMemoryError(what or "an object of the context", size, needed) from None
        offs = cur_end + OBJECT_SIZE
        self.objects.append((offs, size_needed, kind))
        return offs

    def _grow(self, needed: int) -> None:
        capacity = max(needed, 2 * len(self.buffer))
        if self._reserved is not None and capacity <= len(self._reserved):
            self.buffer = self._reserved[:capacity]   # the same bytes, a longer view: nothing moves
            return
        used = self.used_mem
        limit = memory_limit()
        if limit is not None and used > limit:
            # the copy below would write every byte, untouched zero pages too: the kernel would kill us
            raise MemoryError(f"growing the pool would copy {used} bytes")
        try:
            new, reserved = _allocate(capacity)
        except MemoryError:
            if capacity == needed:
                raise
            new, reserved = _allocate(needed)   # twice the pool is too much; exactly what is needed may do
        new[:used] = self.buffer[:used]
        self.buffer, self._reserved = new, reserved

    def rebind(self, buffer: np.ndarray) -> None:
        """Move the pool into `buffer` (e.g. shared memory); every tensor view follows it."""
        self._check_room(buffer)
        buffer[: self.used_mem] = self.buffer[: self.used_mem]
        self.adopt(buffer)

    def adopt(self, buffer: np.ndarray) -> None:
        """Use `buffer`, which already holds the pool's bytes (copied by the caller), as the pool."""
        self._check_room(buffer)
        self.buffer, self._reserved = buffer, None

    def _check_room(self, buffer: np.ndarray) -> None:
        if len(buffer) < self.used_mem:
            raise GGToolError(f"buffer of {len(buffer)} bytes is smaller than the pool's {self.used_mem}")

    def new_buffer(self, nbytes: int, what: str = "the work buffer") -> int:
        """ggml_new_buffer: a WORK_BUFFER object; returns its payload offset."""
        return self.new_object(OBJ_WORK_BUFFER, nbytes, what)

    @property
    def ggml_mem_size(self) -> int:
        """Bytes a GGML context would need for everything so far, memory-mapped data included; a
        compute buffer (ggtool.compute.bind) is not context memory in GGML, and not counted."""
        return self.used_mem + self.external_bytes - self.compute_buffer_bytes

    # -- tensors ----------------------------------------------------------------------------
    def new_tensor(self, type, ne, view_src: Tensor | None = None, view_offs: int = 0,
                   storage=None, data_offset: int | None = None, nb=None) -> Tensor:
        """ggml_new_tensor_impl: a packed tensor, or a view into `view_src` at `view_offs` (with byte
        strides `nb`, packed if None).

        With `storage` (e.g. a memory-mapped GGUF, see gguf_io.FileStorage) only the struct goes
        into the pool and the data is read from `storage.array[data_offset:]`, as llama.cpp's
        mmap loading does.

        Everything is checked before anything is made: sizes within GGML's int64, and a view
        inside its root's bytes for every element its strides reach (GGML asserts only that the
        packed size fits; a stride that reaches further would read other tensors' memory).
        """
        type = T.parse_type(type)
        ne = [int(n) for n in ne] + [1] * (MAX_DIMS - len(ne))
        if len(ne) > MAX_DIMS or any(n < 0 or n > INT64_MAX for n in ne):
            raise ShapeError(f"invalid shape ne={ne}: up to 4 non-negative dimensions, each below 2^63")
        blck = T.block_size(type)
        if ne[0] % blck:
            raise ShapeError(f"{T.type_name(type)} rows hold blocks of {blck}: ne0={ne[0]} is not a multiple of {blck}")
        data_size = T.row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]
        if data_size > INT64_MAX:
            raise ShapeError(f"a {T.type_name(type)} tensor of ne {ne} would hold {data_size} bytes, "
                             "more than GGML's sizes (int64) can count")
        packed = [T.type_size(type), T.type_size(type) * (ne[0] // blck)]
        packed += [packed[1] * ne[1], packed[1] * ne[1] * ne[2]]
        if view_src is not None:
            view_offs = int(view_offs)
            if view_src.view_src is not None:
                view_offs += view_src.view_offs
                view_src = view_src.view_src
            _check_view(type, ne, packed if nb is None else nb, data_size, view_offs, view_src)
        alloc = view_src is None and storage is None and not self.no_alloc
        try:
            offs = self.new_object(OBJ_TENSOR, TENSOR_SIZE + (data_size if alloc else 0))
        except OutOfMemoryError as e:
            what = f"a {T.type_name(type)} tensor of ne [{', '.join(map(str, ne))}]"
            raise OutOfMemoryError(what, data_size if alloc else TENSOR_SIZE, e.total) from None
        if view_src is not None:
            data_offset = None if view_src.data_offset is None else view_src.data_offset + view_offs
            storage = view_src.storage
        elif alloc:
            data_offset = None if self.measure else offs + TENSOR_SIZE
        elif storage is not None:
            self.external_bytes += pad(data_size)
        else:
            data_offset = None
        t = Tensor(self, type, ne, packed if nb is None else nb, offs, data_offset, storage)
        t.view_src, t.view_offs = view_src, view_offs
        self.tensors.append(t)
        return t

    def materialize(self, t: Tensor) -> None:
        """Copy tensor t, whose data lives outside the pool (a memory-mapped file), into the pool
        (a buffer object, as ggml_new_buffer makes), and point t and every view of it there. An
        op that writes into its source (cpy, clamp) then writes into memory of the context, never
        into the read-only map."""
        if t.storage is None or t.view_src is not None or t.data_offset is None:
            return
        n, old, src = t.nbytes, t.data_offset, t.storage.array
        offs = self.new_object(OBJ_WORK_BUFFER, n, f"a copy of '{t.name}' in the context")
        self.buffer[offs: offs + n] = src[old: old + n]
        self.external_bytes -= pad(n)
        for x in self.tensors:
            if x is t or x.view_src is t:
                x.storage, x.data_offset = None, offs + (x.data_offset - old)

    def new_tensor_from(self, array: np.ndarray, type=None, name: str = "") -> Tensor:
        """A tensor holding `array` (numpy shape (d3, d2, d1, d0) is ggml ne [d0, d1, d2, d3])."""
        array = np.asarray(array)
        if array.ndim > MAX_DIMS:
            raise ShapeError(f"array has {array.ndim} dimensions; GGML tensors have at most 4")
        src_type = T.from_np_dtype(array.dtype)
        type = src_type if type is None else T.parse_type(type)
        ne = list(array.shape[::-1]) or [1]
        t = self.new_tensor(type, ne)
        if name:
            t.name = name
        if t.has_data:
            from .quant import convert
            t.set_data(convert(array.reshape(t.shape), src_type, type, name=name or "tensor"))
        return t

    def get_tensor(self, name: str) -> Tensor | None:
        """ggml_get_tensor: the first tensor with this name."""
        return next((t for t in self.tensors if t.name == name), None)


def _check_view(type, ne, nb, data_size: int, offs: int, root: Tensor) -> None:
    """A view of `root` at byte `offs` with strides `nb`: GGML's own assert (the packed size fits
    from the offset), then every element's bytes inside the root (GGML's nb are size_t: none negative)."""
    if not 0 <= offs <= INT64_MAX:
        raise ShapeError(f"view offset {offs} into '{root.name}' is not between 0 and 2^63-1")
    if any(not 0 <= int(x) <= INT64_MAX for x in nb):
        raise ShapeError(f"view byte strides nb={list(nb)} of '{root.name}': GGML's strides are "
                         "between 0 and 2^63-1 (size_t)")
    if data_size and data_size + offs > root.nbytes:
        raise ShapeError(f"view of {data_size} bytes at offset {offs} runs past the end of "
                         f"'{root.name}' ({root.nbytes} bytes)")
    reach = offs + byte_extent(type, ne, nb)
    if data_size and reach > root.nbytes:
        raise ShapeError(f"view of ne {ne} with byte strides nb {list(nb)} at offset {offs} reaches byte "
                         f"{reach} of '{root.name}', which has {root.nbytes} bytes")


# MAP_NORESERVE where Python (before 3.12) does not name it: its value on the common Linux ABIs
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE",
                         0x4000 if hasattr(os, "uname") and os.uname().machine in ("x86_64", "aarch64") else 0)


_RESERVE_MAX = 64 << 30   # per context: thousands of live contexts stay within the address space


def _allocate(capacity: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(zeroed pool of `capacity` bytes, the reservation it lies in or None)."""
    reserved = _reserve(capacity)
    return (np.zeros(capacity, dtype=np.uint8) if reserved is None else reserved[:capacity]), reserved


def _reserve(capacity: int) -> np.ndarray | None:
    """Zeroed address space for a growing pool: as large as the machine's memory (at most 64 GiB,
    at least `capacity`), private and anonymous, so only the pages written are ever allocated;
    None where it cannot be had (no MAP_NORESERVE, strict overcommit, ulimit -v): the pool then
    grows by copying."""
    if not _MAP_NORESERVE or not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        size = -(-max(capacity, min(ram, _RESERVE_MAX)) // mmap.PAGESIZE) * mmap.PAGESIZE
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except (OSError, ValueError):
        return None
    if hasattr(mmap, "MADV_HUGEPAGE"):   # as numpy asks for its own large arrays
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return np.frombuffer(mm, dtype=np.uint8)
