"""The context's pool as a library user sees it: growth, moving it (rebind)."""

import numpy as np
import pytest

from ggtool.context import OBJECT_SIZE, TENSOR_SIZE, Context


@pytest.mark.parametrize("reserve", [True, False], ids=["reserved", "copying"])
def test_growing_pool_keeps_offsets_and_data(reserve, monkeypatch):
    """A pool without mem_size grows inside reserved address space (nothing copied) or, where that
    cannot be had, by copying; either way offsets and bytes stay as they were."""
    import ggtool.context as C

    if not reserve:
        monkeypatch.setattr(C, "_reserve", lambda capacity: None)
    ctx = Context()
    a = ctx.new_tensor("f32", [1000])
    a.data[...] = np.arange(1000)
    before = ctx.buffer
    tensors = [ctx.new_tensor("f32", [4096, 64]) for _ in range(8)]   # 8 MiB: several growths
    tensors[0].data[...] = 7
    assert (ctx._reserved is not None) == reserve and len(ctx.buffer) >= ctx.used_mem
    big = ctx.buffer
    more = ctx.new_tensor("f32", [4096, 512])                         # 8 MiB more
    if reserve:
        assert np.shares_memory(big, ctx.buffer)                      # grown in place
    assert np.array_equal(a.data.reshape(-1), np.arange(1000)) and np.all(tensors[0].data == 7)
    assert a.data_offset == OBJECT_SIZE + TENSOR_SIZE and more.data_offset < ctx.used_mem
    assert not np.shares_memory(before, ctx.buffer)
    moved = np.zeros(len(ctx.buffer), np.uint8)                       # rebind (shared memory) drops it
    ctx.rebind(moved)
    assert ctx._reserved is None and np.all(tensors[0].data == 7)
    ctx.new_tensor("f32", [4096, 1024])                               # grows out of the moved pool
    assert not np.shares_memory(moved, ctx.buffer) and np.all(tensors[0].data == 7)
