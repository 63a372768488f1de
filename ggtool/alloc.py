"""GGML's graph allocator (ggml-alloc's `ggml_gallocr` over its dynamic `ggml_dyn_tallocr`).

In context mode every tensor keeps its own memory for the whole run. A GGML program that runs a
real graph instead gives each intermediate a place in one *compute buffer* and reuses the place
once the tensor's last consumer has run; llama.cpp logs the result as "compute buffer size".
This module plans that buffer for a `Graph`, the way `ggml_gallocr_reserve` does on the CPU buffer
type (alignment 32, no maximum size):

- the graph's nodes are visited in order; each non-view node gets memory from a free-block list
  (best fit among the free blocks, else the block at the end, which grows the buffer), and a
  tensor's memory goes back to the list, merged with its neighbours, once its last consumer (and
  the last consumer of every view of it) has been allocated;
- a node whose op may compute in place (`ggml_op_can_inplace`) takes over the memory of a source
  with the same type, ne and nb when it is that source's last consumer and the source has no
  views, is not an output and lives in the buffer;
- views (reshape, permute, transpose, view, cpy, clamp...) never get memory: they read their
  source's, which stays alive while the view is used;
- leafs (the program's inputs, weights memory-mapped from a GGUF file, constants) already have
  their data, as tensors with `data != NULL` have for ggml_gallocr: they are never in the buffer
  and never overwritten. Outputs (`outputs=`, or the OUTPUT flag) are never freed, so nothing
  overwrites them either.

    from ggtool.alloc import allocate
    a = allocate(graph, outputs=[logits])
    a.size                  # compute buffer bytes (ggml_gallocr_get_buffer_size)
    a.offset(graph.nodes[i])  # where node i's data starts in the buffer (None: not in it)

Nothing here reads or writes tensor data.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import GGToolError
from .tensor import FLAG_INPUT, FLAG_OUTPUT, Tensor

TENSOR_ALIGNMENT = 32     # ggml-impl.h: the CPU buffer type's alignment (ggml_backend_cpu_buffer_type)
MAX_FREE_BLOCKS = 256     # ggml-alloc.c
_SIZE_MAX = (1 << 64) - 1

# ggml_op_can_inplace (ggml-alloc.c): ops whose result may take its source's memory. HEAD adds FILL
# and ADD_ID, which ggtool does not have.
INPLACE_OPS = frozenset({
    "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD1", "SUB", "MUL", "DIV", "SQR", "SQRT",
    "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "SOFT_MAX",
    "SOFT_MAX_BACK",
})


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


# -- the dynamic allocator: a free-block list ------------------------------------------------------
class FreeList:
    """ggml_dyn_tallocr: free blocks sorted by offset; the last one is the unbounded end of the
    buffer. `alloc` takes the best fit (the smallest block that is big enough, the last of equals)
    among all blocks but the last, else carves the last; `free` merges with neighbours. `max_size`
    is the high-water mark: the buffer size a C program allocates."""

    def __init__(self, alignment: int = TENSOR_ALIGNMENT):
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGToolError(f"alignment must be a power of 2, got {alignment}")
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, _SIZE_MAX // 2]]   # [offset, size]
        self.max_size = 0

    def alloc(self, size: int) -> int:
        size = _align(size, self.alignment)
        blocks = self.blocks
        best, best_size = -1, _SIZE_MAX
        for i in range(len(blocks) - 1):
            bsize = blocks[i][1]
            if size <= bsize <= best_size:
                best, best_size = i, bsize
        if best == -1:
            best = len(blocks) - 1
            if blocks[best][1] < size:   # GGML aborts: the end block holds SIZE_MAX/2 bytes
                raise GGToolError(f"graph allocation: not enough space in the buffer to allocate {size} bytes")
        block = blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del blocks[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def free(self, offset: int, size: int) -> None:
        size = _align(size, self.alignment)
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:            # the freed bytes follow this block
                block[1] += size
                if i + 1 < len(blocks) and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:                # ... or precede it
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        if len(blocks) >= MAX_FREE_BLOCKS:
            raise GGToolError(f"graph allocation: out of free blocks ({MAX_FREE_BLOCKS}, "
                              "GGML_ASSERT(chunk->n_free_blocks < MAX_FREE_BLOCKS) failed)")
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


# -- the result ------------------------------------------------------------------------------------
@dataclass
class Allocation:
    """Where a graph's tensors live in the compute buffer.

    `size`: the buffer's bytes (the free list's high-water mark, as ggml_gallocr allocates it).
    `offsets`: id(tensor) -> byte offset, for every tensor that has memory in the buffer.
    `node_offsets[i]`: where nodes[i]'s data starts (views: their source's offset plus view_offs),
    None for a node whose data is outside the buffer (a view of a leaf, a parameter).
    `inplace`: node index -> the source whose memory it took over.
    `intermediates_size`: the sum of ggml_nbytes over the tensors in the buffer: what they take in
    context mode, where each keeps its own memory (plus 368 bytes of header and padding).
    """

    size: int
    alignment: int
    offsets: dict[int, int]
    node_offsets: list[int | None]
    inplace: dict[int, Tensor] = field(default_factory=dict)
    intermediates_size: int = 0
    n_intermediates: int = 0

    def offset(self, t: Tensor) -> int | None:
        """Byte offset of t's data in the buffer (a view: its source's plus view_offs); None if
        t's data is not in the buffer."""
        if t.view_src is not None:
            base = self.offsets.get(id(t.view_src))
            return None if base is None else base + t.view_offs
        return self.offsets.get(id(t))


class _Info:
    """ggml-alloc's hash_node: consumers and views still to come, and the memory held."""

    __slots__ = ("n_children", "n_views", "offset", "allocated")

    def __init__(self):
        self.n_children = 0
        self.n_views = 0
        self.offset = 0
        self.allocated = False   # the tensor owns memory of the buffer (False once freed or taken over)


class GraphAllocator:
    """ggml_gallocr for one buffer type (GGML's CPU buffer: `alignment` 32).

    `allocate(graph, outputs)` plans the graph (ggml_gallocr_reserve) and returns an `Allocation`.
    The allocator can be reused for other graphs; each call starts from an empty buffer."""

    def __init__(self, alignment: int = TENSOR_ALIGNMENT):
        self.alignment = alignment

    def allocate(self, graph, outputs: Iterable[Tensor] = ()) -> Allocation:
        return _Run(graph, outputs, self.alignment).result()


def allocate(graph, outputs: Iterable[Tensor] = (), alignment: int = TENSOR_ALIGNMENT) -> Allocation:
    """Plan `graph`'s compute buffer as ggml_gallocr does. `outputs` (besides tensors flagged
    OUTPUT) are kept to the end: never freed, never taken over in place."""
    return GraphAllocator(alignment).allocate(graph, outputs)


class _Run:
    def __init__(self, graph, outputs: Iterable[Tensor], alignment: int):
        self.graph = graph
        self.free_list = FreeList(alignment)
        self.info: dict[int, _Info] = {}
        self.out: set[int] = set()
        for t in outputs:       # an output's view keeps its source: that is where its data is
            self.out.add(id(t))
            if t.view_src is not None:
                self.out.add(id(t.view_src))
        self.inplace: dict[int, Tensor] = {}
        self.index = {id(t): i for i, t in enumerate(graph.nodes)}
        self.owned: dict[int, Tensor] = {}   # tensors given memory, in allocation order
        self.counting = True                 # the first pass (see run)
        self.run()

    def get(self, t: Tensor) -> _Info:
        info = self.info.get(id(t))
        if info is None:
            info = self.info[id(t)] = _Info()
        return info

    def owns_memory(self, t: Tensor) -> bool:
        """A tensor the graph computes into memory of its own. Views, leafs and parameters (op
        NONE) and tensors of another context or memory-mapped have their data already, as
        `data != NULL` tensors have for ggml_gallocr."""
        return t.view_src is None and t.op != "NONE" and t.ctx is self.graph.ctx and t.storage is None

    def is_output(self, t: Tensor) -> bool:
        return bool(t.flags & FLAG_OUTPUT) or id(t) in self.out

    # ggml_gallocr_allocate_node
    def allocate_node(self, node: Tensor) -> None:
        info = self.get(node)
        if info.allocated or not self.owns_memory(node):
            return
        info.allocated = True
        if node.op in INPLACE_OPS:
            for parent in node.src:
                if parent is None:
                    continue
                p = self.get(parent)
                if not p.allocated:       # not in the buffer (leafs, views), or freed
                    continue
                if self.is_output(parent) or (parent.view_src is not None and self.is_output(parent.view_src)):
                    continue
                if not _same_layout(node, parent):
                    continue
                # GGML also handles a view parent here, but a view never owns memory of the
                # buffer (the check above), so that branch never runs; neither does it here.
                if p.n_children == 1 and p.n_views == 0:
                    info.offset = p.offset
                    p.allocated = False   # the node owns the memory now: do not free it with the parent
                    if not self.counting:  # (an INPUT node's source is placed anew later: not in place)
                        self.inplace[self.index[id(node)]] = parent
                    self.owned[id(node)] = node
                    return
        info.offset = self.free_list.alloc(node.nbytes)
        self.owned[id(node)] = node

    # ggml_gallocr_free_node
    def free_node(self, t: Tensor) -> None:
        if self.is_output(t):
            return
        info = self.get(t)
        self.free_list.free(info.offset, t.nbytes)
        info.allocated = False

    # ggml_gallocr_alloc_graph_impl
    def run(self) -> None:
        nodes = self.graph.nodes
        # Count consumers and views, and place nodes flagged INPUT (and INPUT sources) first. As in
        # GGML, an INPUT node may take over a source's memory here, with the source's consumers not
        # all counted yet; the source is then placed anew when its turn comes.
        for node in nodes:
            if node.view_src is not None and node.op != "NONE":
                self.get(node.view_src).n_views += 1
            if node.flags & FLAG_INPUT:
                self.allocate_node(node)
            for s in node.src:
                if s is None:
                    continue
                self.get(s).n_children += 1
                if s.flags & FLAG_INPUT:
                    self.allocate_node(s)
        self.counting = False
        for node in nodes:
            for parent in node.src:        # sources are leafs or earlier nodes: nothing to do, as in GGML
                if parent is not None:
                    self.allocate_node(parent)
            self.allocate_node(node)
            for parent in node.src:
                if parent is None:
                    continue
                p = self.get(parent)
                p.n_children -= 1
                if p.n_children == 0 and p.n_views == 0:
                    if parent.view_src is not None:
                        vs = self.get(parent.view_src)
                        vs.n_views -= 1
                        if vs.n_views == 0 and vs.n_children == 0 and vs.allocated:
                            self.free_node(parent.view_src)
                    elif p.allocated:
                        self.free_node(parent)

    def result(self) -> Allocation:
        offsets = {key: self.info[key].offset for key in self.owned}
        node_offsets = []
        for t in self.graph.nodes:
            if t.view_src is not None:
                base = offsets.get(id(t.view_src))
                node_offsets.append(None if base is None else base + t.view_offs)
            else:
                node_offsets.append(offsets.get(id(t)))
        return Allocation(self.free_list.max_size, self.free_list.alignment, offsets, node_offsets,
                          self.inplace, sum(t.nbytes for t in self.owned.values()), len(self.owned))


def _same_layout(a: Tensor, b: Tensor) -> bool:
    """ggml_are_same_layout: same type, ne and nb."""
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb
