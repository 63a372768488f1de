"""GGML's compute graph: visited hash set, post-order expand, nodes vs leafs (ggml_new_graph,
ggml_build_forward_expand, ggml_visit_parents)."""

from __future__ import annotations

from .context import OBJ_GRAPH, Context, pad
from .errors import GGToolError, GraphFullError
from .tensor import FLAG_PARAM, Tensor

DEFAULT_GRAPH_SIZE = 2048
_PRIMES = (2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537,
           131101, 262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467,
           67108879, 134217757, 268435459, 536870923, 1073741827, 2147483659)
# Stand-in for the pool's address: the hash is (address of the tensor struct >> 4) % size.
_POOL_BASE = 0x7F0000000000
CGRAPH_SIZE = 80  # sizeof(struct ggml_cgraph) at the reference commit


def hash_size(min_sz: int) -> int:
    """ggml_hash_size: the smallest prime of GGML's table >= min_sz."""
    for p in _PRIMES:
        if p >= min_sz:
            return p
    return min_sz | 1


def graph_nbytes(size: int, grads: bool) -> int:
    hs = hash_size(2 * size)
    return CGRAPH_SIZE + 16 * size + 8 * hs * (1 + 2 * grads) + 4 * ((hs + 31) // 32)


def graph_overhead(size: int = DEFAULT_GRAPH_SIZE, grads: bool = False) -> int:
    """ggml_graph_overhead_custom: pool bytes one graph object takes."""
    return 32 + pad(graph_nbytes(size, grads))


class Graph:
    """A forward graph allocated in `ctx`: `Graph(ctx)` is `ggml_new_graph(ctx)`, `Graph(ctx, size,
    grads)` `ggml_new_graph_custom`. Planning and computing it are functions of the layers above
    (`ggtool.make_plan(graph, n)`, `ggtool.allocate(graph, outputs)`, `ggtool.graph_compute(graph, n)`):
    a graph knows its context and tensors, nothing that runs it."""

    def __init__(self, ctx: Context, size: int = DEFAULT_GRAPH_SIZE, grads: bool = False):
        if size < 1:
            raise GGToolError(f"graph size must be at least 1, got {size}")
        self.ctx, self.size, self.grads = ctx, size, grads
        self.offset = ctx.new_object(OBJ_GRAPH, graph_nbytes(size, grads), f"a graph of size {size}")
        self.hash_size = hash_size(2 * size)
        # the occupied slots only: a table of 2 * size slots as a list would cost 8 bytes a slot up
        # front (2.1 GB for --graph-size 10^8) for a graph that may hold a few nodes
        self._keys: dict[int, Tensor] = {}
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.binding = None          # ggtool.compute.Binding while the nodes live in a compute buffer
        self.compute_buffer: tuple[int, int] | None = None   # (payload offset, bytes) of that buffer

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def _insert(self, t: Tensor) -> bool:
        """Hash-set insert with linear probing; False if `t` was already there."""
        size = self.hash_size
        h = i = ((_POOL_BASE + t.struct_offset) >> 4) % size
        keys = self._keys
        while (k := keys.get(i)) is not None:
            if k is t:
                return False
            i = (i + 1) % size
            if i == h:
                raise GraphFullError(f"the graph's hash set is full ({size} slots)")
        keys[i] = t
        return True

    def contains(self, t: Tensor) -> bool:
        """ggml_hash_contains: probe from t's slot, as insertion does."""
        size, keys = self.hash_size, self._keys
        h = i = ((_POOL_BASE + t.struct_offset) >> 4) % size
        while (k := keys.get(i)) is not None:
            if k is t:
                return True
            i = (i + 1) % size
            if i == h:
                break
        return False

    def expand(self, tensor: Tensor) -> Graph:
        """ggml_build_forward_expand: add `tensor` and its unvisited ancestors in post-order."""
        if tensor.ctx is not self.ctx:
            raise GGToolError(f"tensor '{tensor.name}' belongs to another context")
        n0 = self.n_nodes
        stack: list[list] = []
        if self._insert(tensor):
            stack.append([tensor, 0])
        while stack:  # iterative DFS: deep graphs must not hit Python's recursion limit
            frame = stack[-1]
            t, i = frame
            srcs = t.src
            while i < len(srcs) and srcs[i] is None:
                i += 1
            if i < len(srcs):
                frame[1] = i + 1
                if self._insert(srcs[i]):
                    stack.append([srcs[i], 0])
            else:
                stack.pop()
                self._add(t)
        if self.n_nodes > n0 and self.nodes[-1] is not tensor:
            raise GGToolError("GGML_ASSERT(cgraph->nodes[cgraph->n_nodes - 1] == tensor) failed")
        return self

    def _add(self, t: Tensor) -> None:
        if t.op == "NONE" and not t.flags & FLAG_PARAM:
            if self.n_leafs >= self.size:
                raise GraphFullError(
                    f"graph is full: {self.size} leafs already (GGML_ASSERT(cgraph->n_leafs < cgraph->size) failed); "
                    "create the graph with a larger size")
            if not t.name:
                t.name = f"leaf_{self.n_leafs}"
            self.leafs.append(t)
        else:
            if self.n_nodes >= self.size:
                raise GraphFullError(
                    f"graph is full: {self.size} nodes already (GGML_ASSERT(cgraph->n_nodes < cgraph->size) failed); "
                    "create the graph with a larger size")
            if not t.name:
                t.name = f"node_{self.n_nodes}"
            self.nodes.append(t)

    def node(self, i: int) -> Tensor:
        """ggml_graph_node: negative i counts from the end."""
        return self.nodes[i]

    def __repr__(self) -> str:
        return f"<Graph {self.n_nodes} nodes, {self.n_leafs} leafs, size {self.size}>"
